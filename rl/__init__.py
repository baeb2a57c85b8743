"""codemill.rl: RL for code. Environments turn tasks into episodes, engines sample them, the rollout loop
collects trajectories, algorithms update the policy. No Prefect here."""
