"""`lab probe`: a short session that tests a machine before a run depends on it.

    account   the control half: pushes the probe kernel to a Kaggle account, follows it, stores the verdict
    record    the stored verdict and facts (`accounts/<name>/probe.json`) and the measured burst beside it
    session   the kernel half, pasted into the probe notebook: what the session has (GPUs, versions, mounts, disk)
    worker    run by torchrun inside the session: one all-reduce and a short training burst
"""
