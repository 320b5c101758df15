"""The task and the model: concept world, scenes, towers, objectives."""
