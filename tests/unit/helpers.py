import numpy as np
import torch


def outcome_batch(rewards, lengths, width=None):
    """(R, M) for responses with scalar rewards placed on their last valid token."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    lengths = torch.as_tensor(lengths)
    width = width or max(int(lengths.max()), 1)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(len(rewards), width)
    last = (lengths - 1).clamp(min=0)
    token_rewards[torch.arange(len(rewards)), last] = rewards * (lengths > 0).float()
    return token_rewards, mask


def uids(*group_sizes):
    return np.array([f"g{g}" for g, n in enumerate(group_sizes) for _ in range(n)], dtype=object)
