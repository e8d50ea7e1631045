"""Everything that tells the user something is wrong, by when it runs. Each module has one job:

- before a model loads: :mod:`~trl_rlvr.checks.columns` (the dataset's columns against what the rewards read),
  :mod:`~trl_rlvr.checks.settings` (options without effect, tool settings that cannot work together) and
  :mod:`~trl_rlvr.checks.machine` (settings this machine cannot run: one error naming the overrides);
- during a run: :mod:`~trl_rlvr.checks.alarms` (pure rules over metric histories, and the callback
  ``RLVRTrainer`` adds); :mod:`~trl_rlvr.checks.shift_monitor` (``policy_shift_metrics``: how far each optimizer step
  moved the policy on the rollouts it trained on, with its alarm);
- on one measured batch: :mod:`~trl_rlvr.checks.verdicts` (the doctor's verdicts: pure functions of measured
  numbers, each returning a :class:`~trl_rlvr.checks.verdicts.Check`); :mod:`~trl_rlvr.checks.batch_size` (rollouts
  per optimizer step against the learning rate, from the settings alone).

``check_*`` functions raise (or warn) on bad input; ``*_verdict`` functions return a verdict to print. The commands
over them are ``trl-rlvr doctor`` (:mod:`trl_rlvr.scripts.doctor`) and ``trl-rlvr rewards audit``
(:mod:`trl_rlvr.scripts.audit`, over :mod:`trl_rlvr.audit`). Import from the modules: the alarms import
transformers, the settings checks do not.
"""
