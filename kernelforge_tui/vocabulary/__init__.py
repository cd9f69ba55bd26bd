"""The shared typed vocabulary: nodes, events, commands, evaluation results, rewards, profiles.

Everything here is a pydantic model or an enum, and imports nothing of the package but cards (a launch
plan is part of a command and of a node) and errors, so the engine, the store, the GPU layer and the
views all speak one language without importing each other. Import from the submodules.
"""
