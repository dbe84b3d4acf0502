"""The trial session: the short kernel that checks a machine before a run depends on it, pushed
to a Kaggle account by `lab probe` (lab.probe) and sent to a box by its check
(lab.machines.remote.check).

    session       the session half: what the machine has (GPUs, versions, mounts, disk), the call
    worker        run by torchrun inside the session: one all-reduce and a short training burst
                  with the training notebook's own step
    box_session   a box's half: the Python, the packages the training notebook needs, free disk
    sources       their code as the probe notebook and a box's check paste it
"""
