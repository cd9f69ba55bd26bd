"""The search engine: a revision tree, MCTS selection, and the asyncio pipeline that drives it."""
