"""A user model factory that also does what a torch release that moved a private checkpoint name
does to hpctrain (torch 2.8 had no CURRENT_DCP_VERSION, and every save raised ImportError): it
removes `_StorageInfo` from torch's DCP filesystem module, so the first save fails the same way.
Used by tests/test_compat.py (PYTHONPATH: tests/scripts and tests)."""


def make_model(config):
    import torch.distributed.checkpoint.filesystem as fs

    if hasattr(fs, "_StorageInfo"):
        del fs._StorageInfo
    from test_train_e2e import make_model as real

    return real(config)
