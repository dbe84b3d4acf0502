"""`lab probe`: a short Kaggle session that tests an account before a run depends on it.

    account   pushes the trial session (lab.trial) to a Kaggle account, follows it, stores the
              verdict (lab.kaggle.probed: `accounts/<name>/probe.json`, the measured burst beside it)
"""
