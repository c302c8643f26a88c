"""Site profiles: every shipped profile resolves; every kind of bad input is exit 2 with
file:line: key and a fix, no traceback; layers, locks, discovery, trust, publish, docs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _profiles_common import REPO, SHIPPED, cli, invalid, write

from hpctrain.kernel import jobenv
from hpctrain.profiles import Profile, resolve
from hpctrain.profiles.schema import check_nccl_ifname


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user config or site path from the machine running the tests."""
    home = tmp_path / "xdg"
    home.mkdir()
    os.chmod(home, 0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    return home


# --- shipped profiles ---------------------------------------------------------------------------


def test_the_shipped_set() -> None:
    assert SHIPPED == ["aws-efa", "ethernet", "generic-ib", "local", "loopback", "roce"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_validates_and_resolves(name: str) -> None:
    result = cli("profiles", "validate", str(REPO / "site_configs" / f"{name}.yaml"))
    assert result.exit_code == 0 and result.output.strip().endswith(": ok"), result.output
    profile = resolve(name)
    assert isinstance(profile, Profile) and profile.name == name
    assert profile.source == (REPO / "site_configs" / f"{name}.yaml").resolve()
    assert set(profile.origins) >= {
        "slurm.gpus_per_node",
        "network.socket_ifname",
        "preemption.signal",
    }


def test_loopback_matches_the_live_cluster() -> None:
    """tests/slurm/cluster.sh builds the cluster from these values."""
    p = resolve("loopback")
    assert (p.scheduler, p.slurm.partition, p.slurm.gpu_request, p.slurm.gpus_per_node) == (
        "slurm",
        "debug",
        "gpus-per-node",
        2,
    )
    assert (p.slurm.cpus_per_task, p.slurm.mem, p.slurm.gpu_mem_gib, p.slurm.max_nodes) == (
        1,
        None,
        None,
        3,  # n1, n2 and the spare n3 (tests/test_spares_live.py)
    )
    assert (p.slurm.default_time_min, p.slurm.max_time_min) == (10, 30)
    assert (p.network.socket_ifname, p.network.gloo_ifname) == ("lo", "lo")
    assert (p.preemption.signal, p.preemption.warning_s, p.preemption.requeue) == ("USR2", 30, True)
    assert p.storage.runs_dir is None


def test_local_is_cpu_on_loopback() -> None:
    p = resolve("local")
    assert (p.scheduler, p.slurm.gpus_per_node, p.network.socket_ifname) == ("local", 0, "lo")


def test_roce_inherits_generic_ib_with_origins() -> None:
    p = resolve("roce")
    ib = str((REPO / "site_configs" / "generic-ib.yaml").resolve())
    assert p.slurm.gpus_per_node == 8 and p.network.ib_gid_index == 3
    assert p.origins["slurm.gpus_per_node"].startswith(ib + ":")
    assert p.origins["network.ib_gid_index"].startswith(str(p.source) + ":")
    assert p.network.env["NCCL_IB_TIMEOUT"] == "22" and p.network.env["NCCL_IB_TC"] == "106"
    assert p.locked == ["slurm.account", "slurm.partition"]
    assert p.origins["rendezvous.port_min"].startswith(ib + ":")
    assert p.origins["slurm.qos"] == "default"


def test_aws_efa_container_and_libfabric() -> None:
    p = resolve("aws-efa")
    assert p.network.socket_ifname == "^docker,lo" and p.network.gloo_ifname is None
    assert p.network.env["FI_PROVIDER"] == "efa" and p.network.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert p.environment.container is not None and p.environment.container.kind == "pyxis"


# --- bad input: one problem each, file:line: key: message; fix ------------------------------------

BAD = {
    "unknown key at depth": (
        "name: x\nslurm:\n  partiton: gpu\n",
        ":3: slurm.partiton: unknown key; did you mean 'partition'?",
    ),
    "unknown top key": (
        "name: x\nschedular: slurm\n",
        ":2: schedular: unknown key; did you mean 'scheduler'?",
    ),
    "unknown env section key": (
        "name: x\nenvironment:\n  container:\n    kind: pyxis\n    image: a\n    mount: []\n",
        ":6: environment.container.mount: unknown key; did you mean 'mounts'?",
    ),
    "wrong type": (
        "name: x\nslurm:\n  gpus_per_node: eight\n",
        ":3: slurm.gpus_per_node: 'eight' is not a whole number; fix: write a whole number, "
        "e.g. `gpus_per_node: 8`",
    ),
    "wrong type bool": ("name: x\nslurm:\n  exclusive: maybe\n", ":3: slurm.exclusive:"),
    "wrong type list": (
        "name: x\nslurm:\n  extra_sbatch: --exclusive\n",
        ":3: slurm.extra_sbatch: Input should be a valid list",
    ),
    "negative count": (
        "name: x\npreemption:\n  max_restarts: -1\n",
        ":3: preemption.max_restarts: Input should be greater than or equal to 0",
    ),
    "negative gpus": ("name: x\nslurm:\n  gpus_per_node: -8\n", ":3: slurm.gpus_per_node:"),
    "default above max time": (
        "name: x\nslurm:\n  default_time_min: 90\n  max_time_min: 30\n",
        ":3: slurm.default_time_min: default_time_min 90 is above max_time_min 30",
    ),
    "cpus both ways": (
        "name: x\nslurm:\n  gpus_per_node: 4\n  cpus_per_gpu: 8\n  cpus_per_task: 32\n",
        ":5: slurm.cpus_per_task: cpus_per_gpu and cpus_per_task are both set",
    ),
    "bad ports": (
        "name: x\nrendezvous:\n  port_min: 80\n  port_max: 90000\n",
        ":3: rendezvous.port_min: port range 80-90000",
    ),
    "bad signal": (
        "name: x\npreemption:\n  signal: QUIT\n",
        ":3: preemption.signal: Input should be 'USR2'",
    ),
    "kill signal": (
        "name: x\npreemption:\n  signal: SIGKILL\n",
        ":3: preemption.signal: KILL cannot be the preemption warning",
    ),
    "bad interface =^": (
        "name: x\nnetwork:\n  socket_ifname: =^eth0\n",
        ":3: network.socket_ifname: '=^eth0' is not an NCCL interface",
    ),
    "bad gloo interface": (
        "name: x\nnetwork:\n  gloo_socket_ifname: ^lo\n",
        ":3: network.gloo_socket_ifname: '^lo' is not a gloo",
    ),
    "bad hca": ("name: x\nnetwork:\n  ib: true\n  ib_hca: mlx5_0:x\n", ":4: network.ib_hca:"),
    "hca without ib": (
        "name: x\nnetwork:\n  ib_hca: mlx5_0\n",
        ":3: network.ib_hca: ib_hca is set but ib is false",
    ),
    "owned sbatch directive": (
        "name: x\nslurm:\n  extra_sbatch:\n    - --exclusive\n    - --nodes=4\n",
        ":5: slurm.extra_sbatch[1]: '--nodes=4': hpctrain sets --nodes itself",
    ),
    "abbreviated directive": (
        "name: x\nslurm:\n  extra_sbatch: [--sig=B:USR1@60]\n",
        "abbreviates --signal",
    ),
    "shell in directive": (
        "name: x\nslurm:\n  extra_sbatch: ['--comment=$(id)']\n",
        "is not a safe sbatch option",
    ),
    "short directive": (
        "name: x\nslurm:\n  srun_args: ['-N 2']\n",
        ":3: slurm.srun_args[0]: '-N 2' is not a safe srun option",
    ),
    "container in srun": (
        "name: x\nslurm:\n  srun_args: [--container-image=x]\n",
        "set environment.container",
    ),
    "env name": (
        "name: x\nenvironment:\n  env:\n    bad-name: 1\n",
        ":4: environment.env.bad-name: 'bad-name' is not a valid variable name",
    ),
    "env value newline": (
        'name: x\nenvironment:\n  env:\n    A: "x\\ny"\n',
        ":4: environment.env.A: the value contains a newline",
    ),
    "network env prefix": (
        "name: x\nnetwork:\n  env:\n    MY_LIB: /x.so\n",
        ":4: network.env.MY_LIB: MY_LIB is not a network variable",
    ),
    "dedicated env": (
        "name: x\nnetwork:\n  env:\n    NCCL_SOCKET_IFNAME: eth0\n",
        "set network.socket_ifname instead",
    ),
    "owned env": (
        "name: x\nenvironment:\n  env:\n    MASTER_PORT: '29500'\n",
        "is set by hpctrain's script",
    ),
    "missing name": ("scheduler: local\n", "name: required key is missing"),
    "bad name": ("name: My Cluster\n", ":1: name: 'My Cluster' is not a profile name"),
    "locked unknown key": (
        "name: x\nlocked: [slurm.acount]\n",
        ":2: locked[0]: locked key 'slurm.acount'",
    ),
    "runs_dir shell": (
        "name: x\nstorage:\n  runs_dir: /x/$(id)\n",
        ":3: storage.runs_dir: runs_dir '/x/$(id)' contains shell syntax",
    ),
    "bad mount": (
        "name: x\nenvironment:\n  container: {kind: apptainer, image: a.sif, mounts: ['/a /b']}\n",
        "is not PATH or SRC:DST",
    ),
    "container kind": (
        "name: x\nenvironment:\n  container: {kind: docker, image: a}\n",
        ":3: environment.container.kind:",
    ),
    "relative activate": ("name: x\nenvironment:\n  activate: venv\n", "is a relative path"),
    "non-mapping": ("- a\n- b\n", ":1: the top level is not a mapping"),
    "scalar file": ("just text\n", "the top level is not a mapping"),
    "empty": ("# nothing\n", "empty file"),
    "python tag": (
        "name: x\ndescription: !!python/object/apply:os.system ['touch /tmp/pwned']\n",
        ":2: description: tag !!python/object/apply:os.system is not allowed",
    ),
    "python object tag": (
        "name: x\ndescription: !!python/object:builtins.dict {}\n",
        "tag !!python/object:builtins.dict is not allowed",
    ),
    "local tag": ("name: x\nversion: !foo 3\n", ":2: version: tag !foo is not allowed"),
    "str tag": ("name: x\nversion: !!str 3\n", "tag !!str is not allowed"),
    "alias": (
        "name: x\ndescription: &d hello\nversion: *d\n",
        ":2: description: anchor &d is not allowed",
    ),
    "duplicate key": (
        "name: x\nslurm:\n  partition: a\n  partition: b\n",
        ":4: slurm.partition: duplicate key (first on line 3)",
    ),
    "yaml syntax": ("name: x\nslurm: [\n", "not valid YAML"),
    "bad extends": (
        "name: x\nextends: generic-iv\n",
        ":2: extends: extends 'generic-iv': no such profile; did you mean 'generic-ib'?",
    ),
    "missing extends file": (
        "name: x\nextends: ./nope.yaml\n",
        ":2: extends: extends './nope.yaml': no such file",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_exit_2_with_location(case: str, tmp_path: Path) -> None:
    text, expected = BAD[case]
    path = write(tmp_path / "p" / "bad.yaml", text)
    out = invalid(path)
    assert str(path) in out and expected in out, out
    assert "fix" in out or "did you mean" in out


def test_binary_non_utf8_deep_and_huge(tmp_path: Path) -> None:
    assert "binary file" in invalid(write(tmp_path / "d" / "bin.yaml", b"name: x\x00\x01\x02"))
    assert "not UTF-8" in invalid(
        write(tmp_path / "d" / "latin.yaml", "name: caf\xe9\n".encode("latin-1"))
    )
    deep = (
        "name: x\nslurm:\n"
        + "".join("  " * i + f"k{i}:\n" for i in range(1, 12))
        + "  " * 12
        + "v: 1\n"
    )
    out = invalid(write(tmp_path / "d" / "deep.yaml", deep))
    assert "nested deeper than 8 levels" in out and "deep.yaml:10:" in out
    out = invalid(write(tmp_path / "d" / "huge.yaml", "name: x\n" + "#" * 300_000 + "\n"))
    assert "more than the 262144 allowed" in out


def test_no_tag_constructs_anything(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    write(
        tmp_path / "d" / "evil.yaml",
        f"name: x\ndescription: !!python/object/apply:os.system ['touch {marker}']\n",
    )
    invalid(tmp_path / "d" / "evil.yaml")
    assert not marker.exists()


def test_all_problems_of_a_file_reported_together(tmp_path: Path) -> None:
    path = write(
        tmp_path / "p" / "many.yaml",
        """\
name: many
slurm:
  partiton: gpu
  default_time_min: 90
  max_time_min: 30
network:
  socket_ifname: "eth0, lo"
preemption:
  warning_s: -5
  signal: KILL
color: blue
""",
    )
    out = invalid(path)
    assert "6 problems found" in out
    for line, key in [
        (3, "slurm.partiton"),
        (4, "slurm.default_time_min"),
        (7, "network.socket_ifname"),
        (9, "preemption.warning_s"),
        (10, "preemption.signal"),
        (11, "color"),
    ]:
        assert f"{path}:{line}: {key}: " in out, (line, key, out)


def test_validate_several_files_reports_every_file(tmp_path: Path) -> None:
    good = REPO / "site_configs" / "local.yaml"
    a = write(tmp_path / "p" / "a.yaml", "name: a\nslurm: {gpus_per_node: -1}\n")
    b = write(tmp_path / "p" / "b.yaml", "name: b\nnetwork: {ib_gid_index: x}\n")
    result = cli("profiles", "validate", str(good), str(a), str(b))
    assert result.exit_code == 2
    assert f"{good}: ok" in result.output and f"{a}:2: slurm.gpus_per_node" in result.output
    assert f"{b}:2: network.ib_gid_index" in result.output


@pytest.mark.parametrize(
    "expr",
    [
        "eth",
        "=eth0",
        "ib0,ib1",
        "^docker,lo",
        "^=docker0",
        "lo",
        "enp90s0np0",
        "bond0.100",
        "eth0:1",
    ],
)
def test_nccl_interface_syntax_accepted(expr: str) -> None:
    assert check_nccl_ifname(expr) == expr


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "^",
        "=",
        "=^eth0",
        "^^eth",
        "eth0,,lo",
        ",eth0",
        "eth0,",
        "eth 0",
        "eth0;reboot",
        "$(id)",
        "eth0\n",
        "a" * 16,
        "^eth,=lo",
    ],
)
def test_nccl_interface_syntax_refused(expr: str) -> None:
    with pytest.raises(ValueError, match="fix:"):
        check_nccl_ifname(expr)
