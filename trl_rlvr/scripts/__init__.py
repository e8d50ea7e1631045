"""The commands: ``trl-rlvr`` (:mod:`.cli`) with ``train`` (:mod:`.train`: recipes through ``TrlParser``), ``eval``
(:mod:`.eval`), ``rewards``; and what they share: data sets and prompts (:mod:`.data`), model loading (:mod:`.models`).
"""
