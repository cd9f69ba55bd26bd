"""Every TUI action: its default key, its binding id (the name the config keymap remaps) and its words.

One table feeds the app's `BINDINGS`, the command palette and the help screen, so they never disagree.
Remap in the config file (`[tui.keymap]`, e.g. `pause_resume = "space"`) or with
`KERNELFORGE_TUI__KEYMAP='{"stop": "ctrl+x"}'`; `App.set_keymap` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Action:
    id: str
    key: str
    action: str
    description: str
    help: str
    show: bool = False
    """Listed in the footer."""
    steering: bool = False
    """Sends a command to the engine: disabled while no search can hear it (a finished run)."""
    at_rest: bool = False
    """A steering flag (pin, ban) that a run nobody writes also takes: stored now, read back by the next resume."""
    on_node: bool = False
    """Acts on the selected node: disabled while none is selected."""
    measured: bool = False
    """Acts only on a measured node (verified, timed or profiled): disabled on a failed or unfinished one."""
    takes_children: bool = False
    """Asks for children of the node: disabled on a failed node, which never gets any."""
    pane: str = ""
    """Bound on one pane's widget (`tree`: the search tree), active while it has the focus; empty: app-wide."""


ACTIONS: tuple[Action, ...] = (
    Action(
        "tree_open", "right", "open_node", "Open", "Tree: open the node (again: go to its first child)", pane="tree"
    ),
    Action("tree_close", "left", "close_node", "Close", "Tree: close the node (again: go to its parent)", pane="tree"),
    Action("help", "question_mark", "help", "Keys", "Show every key, its binding id and what it does", show=True),
    Action("pause_resume", "p", "pause_resume", "Pause", "Pause the search, or resume it", show=True, steering=True),
    Action(
        "expand",
        "x",
        "expand",
        "Expand",
        "Propose children of the selected node next",
        show=True,
        steering=True,
        on_node=True,
        measured=True,
    ),
    Action(
        "hint",
        "h",
        "hint",
        "Hint",
        "Add a hint for the selected node's next children",
        show=True,
        steering=True,
        on_node=True,
        takes_children=True,
    ),
    Action(
        "edit",
        "e",
        "edit",
        "Edit",
        "Edit the selected kernel and submit it as a child",
        show=True,
        steering=True,
        on_node=True,
    ),
    Action(
        "edit_external",
        "E",
        "edit_external",
        "Edit in $EDITOR",
        "Edit the selected kernel in $EDITOR and submit it as a child",
        steering=True,
        on_node=True,
    ),
    Action(
        "profile",
        "n",
        "profile",
        "Profile",
        "Profile the selected node with Nsight Compute (saved on the node)",
        steering=True,
        on_node=True,
        measured=True,
    ),
    Action(
        "ban",
        "b",
        "ban",
        "Ban",
        "Ban (or unban) the selected subtree from selection",
        steering=True,
        on_node=True,
        at_rest=True,
    ),
    Action(
        "pin",
        "t",
        "pin",
        "Pin",
        "Pin (or unpin) selection to the selected subtree",
        steering=True,
        on_node=True,
        at_rest=True,
    ),
    Action(
        "export",
        "m",
        "export_kernel",
        "Export",
        "Write the selected node's kernel.cu, plan.toml and summary.md to kernels/ beside the run",
        on_node=True,
    ),
    Action("stop", "S", "stop", "Stop", "Stop the search (it stays resumable)", steering=True),
    Action("jump_best", "g", "jump_best", "Best", "Jump to the best node and open its path", show=True),
    Action(
        "filter", "f", "cycle_filter", "Filter", "Cycle the tree filter: all, only improving, only failures", show=True
    ),
    Action("diff_base", "d", "cycle_diff_base", "Diff vs", "Diff the selected node against parent, baseline, best"),
    Action("diff_layout", "s", "toggle_diff_layout", "Side by side", "Flip the diff between unified and side by side"),
    Action(
        "diff_folds",
        "o",
        "toggle_diff_folds",
        "Unfold",
        "Show the whole file in the diff, or only the changed hunks with the rest folded",
    ),
    Action(
        "maximize",
        "z",
        "toggle_maximize",
        "Zoom",
        "Maximise the focused pane to the whole screen, or restore it (esc restores too)",
        show=True,
    ),
    Action("chart", "v", "chart", "Chart", "Chart the best speedup and share of the ceiling over the candidates"),
    Action(
        "conversation",
        "c",
        "conversation",
        "Conversation",
        "The selected node's LLM calls: prompts, replies, tokens, cost",
        on_node=True,
    ),
    Action(
        "follow_writing",
        "w",
        "toggle_follow_writing",
        "Follow writing",
        "Stream kernels being written for any node, not only the selected",
    ),
    Action("models", "M", "models", "Models", "Compare the run's LLM providers and models: success, speedup, cost"),
    Action("cluster", "C", "cluster", "Cluster", "Where the run measures: workers, GPUs, what each is on, throughput"),
    Action(
        "quit", "q", "quit_app", "Quit", "Quit (a search in this process stops cleanly; q again quits now)", show=True
    ),
)

BY_ID = {a.id: a for a in ACTIONS}
BY_ACTION = {a.action: a for a in ACTIONS}


def bindings(pane: str = "") -> list[Binding]:
    """The bindings of one pane's widget (`pane`), or the app's own (the default)."""
    return [Binding(a.key, a.action, a.description, show=a.show, id=a.id) for a in ACTIONS if a.pane == pane]


def validate_keymap(keymap: dict[str, str]) -> dict[str, str]:
    """The keymap as given; an id that is not ours is an error naming the known ones (a silently ignored
    typo would leave the user wondering why the key does nothing), and so is a key the keymap gives to an action
    while another keeps it (which one a press runs would depend on the order bindings are looked up in)."""
    unknown = sorted(set(keymap) - set(BY_ID))
    if unknown:
        raise ValueError(f"unknown binding ids in the keymap: {', '.join(unknown)} (known: {', '.join(BY_ID)})")
    owners: dict[str, list[str]] = {}
    for action in ACTIONS:
        for key in keymap.get(action.id, action.key).split(","):
            owners.setdefault(key.strip(), []).append(action.id)
    clashes = [f"{key} ({' and '.join(ids)})" for key, ids in owners.items() if len(ids) > 1]
    if clashes:
        raise ValueError(f"keys bound to two actions by the keymap: {', '.join(clashes)}: remap one of each pair too")
    return dict(keymap)
