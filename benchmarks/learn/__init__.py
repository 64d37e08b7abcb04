"""``rlkube bench learn``: learning curves of a reference job, rlkube's PPO beside SB3's."""
