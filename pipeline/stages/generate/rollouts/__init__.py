"""RL rollouts: n scored samples per prompt (`samples`), reward functions (`rewards`), and the
hooks that tag each sample with the actor revision that made it (`hooks`)."""
