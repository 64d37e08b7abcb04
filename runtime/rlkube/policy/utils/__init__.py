"""RLightning's policy.utils in rlkube's own words: losses, router and V-trace."""
