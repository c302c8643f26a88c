# Sourced by every stand-in: append one JSON line {"tool", "argv", "host", "cwd"} to
# $STANDIN_RECORD/<tool>.jsonl (nothing when STANDIN_RECORD is unset), then return.
standin_record() {  # TOOL ARGS...
  [ -n "${STANDIN_RECORD:-}" ] || return 0
  local tool=$1 arg json
  shift
  json=$(printf '%s\0' "$@" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().split("\0")[:-1]))')
  printf '{"tool": "%s", "host": "%s", "argv": %s}\n' "$tool" "$(hostname)" "$json" >>"$STANDIN_RECORD/$tool.jsonl"
}
# The next program of this name on PATH after the stand-ins folder (the real one).
standin_real() {  # NAME
  local here dir
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  local IFS=:
  for dir in $PATH; do
    [ "$dir" = "$here" ] && continue
    if [ -x "$dir/$1" ]; then echo "$dir/$1"; return 0; fi
  done
  echo "standin: no real $1 on PATH" >&2
  return 127
}
