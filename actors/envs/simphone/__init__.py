"""SimPhone: the built-in Android-like phone (see docs/SIMPHONE.md). Registered as gymnasium id "SimPhone-v0"."""

import gymnasium

if "SimPhone-v0" not in gymnasium.registry:
    gymnasium.register(id="SimPhone-v0", entry_point="actors.envs.simphone.env:SimPhoneEnv")
