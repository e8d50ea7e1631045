"""The host side of ``code_sandbox``: what runs in the trainer's process. ``pool`` (the reward's sandboxed workers),
``launcher`` (bubblewrap, uids, cgroups; lays the sandbox side into a code dir and starts a server there),
``claim`` (a pool id, its code dir and cgroups, claimed so two pools on one host never share them)."""
