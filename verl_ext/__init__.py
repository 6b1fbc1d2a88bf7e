"""verl_ext: EDGE-GRPO and GEPO for verl 0.9.x."""
