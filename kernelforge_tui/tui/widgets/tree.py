"""The search tree: one line a node, filled lazily and updated in batches.

Textual's `Tree` rebuilds its line list for expanded nodes on every add, so this widget adds a node's
children only when the node is expanded (`NodeExpanded`), adds the children of expanded nodes in one
go per batch, and renders labels from the run state (cached per node view) instead of storing them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from rich.style import Style
from rich.text import Text
from textual.binding import BindingType
from textual.reactive import var
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from kernelforge_tui.engine.view import Changes, RunView
from kernelforge_tui.tui.keymap import bindings
from kernelforge_tui.vocabulary.nodes import NodeStatus, NodeView

FilterMode = Literal["all", "improving", "failures"]
FILTERS: tuple[FilterMode, ...] = ("all", "improving", "failures")
FILTER_TITLES: dict[FilterMode, str] = {"all": "all", "improving": "only improving", "failures": "only failures"}
EMPTY: dict[FilterMode, str] = {
    "improving": "no node is faster than its parent yet: f lists the failures, then the whole tree",
    "failures": "no failed node in this run: f shows the whole tree",
}
"""What a filter that lists nothing says in the pane, instead of a blank."""
FILTER_LIMIT = 500
"""A filter lists at most this many nodes (the most recent), to keep the tree fast."""

GLYPHS = {"proposed": "○", "built": "◔", "verified": "◑", "timed": "●", "profiled": "◆", "failed": "✗"}


def node_label(node: NodeView, flat: bool = False) -> Text:
    """`● #12 timed 1.84x 62% v3 vector width 4 -> 8`, flags first (⊘ banned, ⇡ pinned, ★ export); the number and
    the status in words come first, so a narrow pane cuts the mutation, not them. `flat` (a filtered list, no
    guides) names the parent: `#12 from #7`."""
    text = Text(no_wrap=True, end="")
    flags = ("⊘" if node.banned else "") + ("⇡" if node.pinned else "") + ("★" if node.export else "")
    if flags:
        text.append(flags + " ", "bold")
    text.append(GLYPHS.get(node.status, "?") + " ", "status")
    text.append(f"#{node.id}", "id")
    if flat and node.parent_id is not None:
        text.append(f" from #{node.parent_id}", "dim")
    if node.status == "failed":
        text.append(f" failed: {node.failure or 'unknown'}", "failed")
    else:
        text.append(f" {node.status}", "status")
        text.append(f" {node.speedup:.2f}x" if node.speedup is not None else "    - ", "speedup")
        if node.ceiling_share is not None:
            text.append(f" {node.ceiling_share:.0%}", "share")
    text.append(f" v{node.visits}", "visits")
    if node.mutation:
        text.append(" " + node.mutation, "mutation")
    return text


def matches(view: RunView, node: NodeView, mode: FilterMode) -> bool:
    """Whether a filter shows this node."""
    if mode == "improving":
        return view.is_improving(node)
    if mode == "failures":
        return node.status == NodeStatus.FAILED
    return True


class SearchTree(Tree[int]):
    """The search tree; node data is the node id (None: the line saying a filter lists nothing). Filtered, it is a
    flat list of the newest matches. It keeps the reader's place: the node last highlighted stays the one the cursor
    returns to when a filter that hid it is lifted, with its path opened."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("tree"))

    DEFAULT_CSS = """
    SearchTree { background: $surface; overflow-x: hidden; }
    SearchTree > .search-tree--best { color: $success; text-style: bold; }
    SearchTree > .search-tree--failed { color: $text-disabled; }
    SearchTree > .search-tree--banned { color: $text-disabled; text-style: strike; }
    SearchTree > .search-tree--faster { color: $success; }
    SearchTree > .search-tree--slower { color: $warning; }
    SearchTree > .search-tree--id { color: $text-muted; }
    SearchTree > .search-tree--mutation { color: $text-muted; }
    SearchTree > .search-tree--failure { color: $error; }
    SearchTree:ansi > .tree--guides { color: ansi_bright_black; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "search-tree--best",
        "search-tree--failed",
        "search-tree--banned",
        "search-tree--faster",
        "search-tree--slower",
        "search-tree--id",
        "search-tree--mutation",
        "search-tree--failure",
    }

    filter_mode: var[FilterMode] = var[FilterMode]("all")
    """Which nodes are listed: the whole tree, or only the improving or the failed ones."""

    def __init__(self, state: RunView, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("run", id=id, classes=classes)
        self.show_root = False
        self.guide_depth = 2
        self.state = state
        self._tree_node: dict[int, TreeNode[int]] = {}
        self._loaded: set[int] = set()
        self._labels: dict[int, tuple[NodeView, bool, Text]] = {}
        self._styles: dict[str, Style] = {}
        self.place: int | None = None
        """The node the reader is on: the last one highlighted, kept while a filter hides it."""

    # -- labels ---------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._restyle())

    def _restyle(self) -> None:
        self._styles.clear()
        self._labels.clear()
        self.refresh()

    def _style(self, name: str) -> Style:
        if name not in self._styles:
            self._styles[name] = self.get_component_rich_style(f"search-tree--{name}", partial=True)
        return self._styles[name]

    def _label(self, node_id: int) -> Text:
        node = self.state.nodes.get(node_id)
        if node is None:
            return Text(f"#{node_id}")
        on_best = node_id in self.state.best_path()
        cached = self._labels.get(node_id)
        if cached is not None and cached[0] is node and cached[1] == on_best:
            return cached[2]
        raw = node_label(node, flat=self.filter_mode != "all")
        parent = self.state.nodes.get(node.parent_id) if node.parent_id is not None else None
        parent_speedup = parent.speedup if parent is not None and parent.speedup is not None else 1.0
        text = Text(raw.plain, no_wrap=True, end="")
        for span in raw.spans:
            kind = str(span.style)
            style: Style | None = None
            if kind == "failed":
                style = self._style("failure")
            elif kind == "speedup" and node.speedup is not None:
                style = self._style("faster" if node.speedup > parent_speedup else "slower")
            elif kind in ("id", "mutation"):
                style = self._style(kind)
            elif kind == "bold":
                style = Style(bold=True)
            if style is not None:
                text.stylize(style, span.start, span.end)
        if node.status == NodeStatus.FAILED:
            text.stylize(self._style("failed"))
        if node.banned:
            text.stylize(self._style("banned"))
        if on_best:
            text.stylize(self._style("best"))
        self._labels[node_id] = (node, on_best, text)
        return text

    def render_label(self, node: TreeNode[int], base_style: Style, style: Style) -> Text:
        label = self._label(node.data) if node.data is not None else Text(str(node.label), style="italic")
        label = label.copy()
        label.stylize(style)
        prefix = (self.ICON_NODE_EXPANDED if node.is_expanded else self.ICON_NODE) if node.allow_expand else "  "
        return Text.assemble((prefix, base_style + Style(dim=True)), label)

    def get_label_width(self, node: TreeNode[int]) -> int:
        return 2 + (self._label(node.data) if node.data is not None else Text(str(node.label))).cell_len

    # -- filling --------------------------------------------------------------------------------

    def _add(self, parent: TreeNode[int], node_id: int) -> TreeNode[int]:
        has_children = bool(self.state.children.get(node_id)) and self.filter_mode == "all"
        tree_node = parent.add("", node_id, allow_expand=has_children)
        self._tree_node[node_id] = tree_node
        return tree_node

    def _fill(self, node_id: int) -> None:
        """Add a node's children (once)."""
        if node_id in self._loaded or node_id not in self._tree_node:
            return
        self._loaded.add(node_id)
        parent = self._tree_node[node_id]
        for child in self.state.children.get(node_id, ()):
            if child not in self._tree_node:
                self._add(parent, child)

    def rebuild(self) -> None:
        """Start over from the state (on open and when the filter changes), the cursor back on the reader's place
        where the list shows it (nowhere while a filter hides it: the panes keep showing it)."""
        self.clear()
        self._tree_node.clear()
        self._loaded.clear()
        self._labels.clear()
        if self.filter_mode == "all":
            for root_id in self.state.children.get(None, ()):
                self._add(self.root, root_id)
            for root_id in self.state.children.get(None, ()):
                self._fill(root_id)
                self._tree_node[root_id].expand()
        else:
            for node_id in self.matching()[-FILTER_LIMIT:]:
                self._add(self.root, node_id)
        if not self._tree_node and self.filter_mode != "all":
            self.root.add_leaf(EMPTY[self.filter_mode])
        if self.place is not None:
            self.select_id(self.place)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[int]) -> None:
        if event.node.data is not None:
            self.place = event.node.data

    def action_open_node(self) -> None:
        """Open the node under the cursor; on an open one (or a leaf), go to its first child."""
        node = self.cursor_node
        if node is None:
            return
        if node.allow_expand and not node.is_expanded:
            node.expand()
        elif node.children:
            self.move_cursor(node.children[0], animate=False)

    def action_close_node(self) -> None:
        """Close the node under the cursor; on a closed one (or a leaf), go to its parent."""
        node = self.cursor_node
        if node is None:
            return
        if node.allow_expand and node.is_expanded:
            node.collapse()
        elif node.parent is not None and node.parent is not self.root:
            self.move_cursor(node.parent, animate=False)

    def on_tree_node_expanded(self, event: Tree.NodeExpanded[int]) -> None:
        if event.node.data is not None:
            self._fill(event.node.data)

    def watch_filter_mode(self, mode: FilterMode) -> None:
        self.border_title = f"Tree · {FILTER_TITLES[mode]}"
        self.rebuild()

    def matching(self) -> list[int]:
        """Ids the filter shows, in id order."""
        return [i for i, n in self.state.nodes.items() if matches(self.state, n, self.filter_mode)]

    # -- updates --------------------------------------------------------------------------------

    def apply(self, changes: Changes) -> None:
        """Fold one batch of changes in: adds go under loaded parents only, the rest is a repaint."""
        if self.filter_mode != "all":
            self._apply_filtered(changes)
            return
        for node_id in changes.added:
            node = self.state.nodes[node_id]
            if node.parent_id is None:
                self._add(self.root, node_id)
                continue
            parent = self._tree_node.get(node.parent_id)
            if parent is None:
                continue
            if node.parent_id in self._loaded:
                self._add(parent, node_id)
            elif not parent.allow_expand:
                parent.allow_expand = True
        refresh = [i for i in changes.changed if i in self._tree_node]
        if changes.best_changed:
            old = set(self.state.path_to(changes.best_before)) if changes.best_before is not None else set()
            refresh.extend(i for i in old | self.state.best_path() if i in self._tree_node)
        if changes.added:
            # A new child can change how its siblings' parent looks (speedup colour is against the parent).
            refresh.extend(i for i in {self.state.nodes[a].parent_id for a in changes.added} if i in self._tree_node)
        for node_id in set(refresh):
            self._tree_node[node_id].refresh()

    def _apply_filtered(self, changes: Changes) -> None:
        """New matches go at the end (the line saying there were none goes); the list keeps the newest FILTER_LIMIT
        (one rebuild per batch)."""
        for node_id in [*changes.added, *changes.changed]:
            if node_id in self._tree_node:
                self._tree_node[node_id].refresh()
            elif matches(self.state, self.state.nodes[node_id], self.filter_mode):
                for empty in [c for c in self.root.children if c.data is None]:
                    empty.remove()
                self._add(self.root, node_id)
        children = self.root.children
        for extra in list(children[: max(0, len(children) - FILTER_LIMIT)]):
            if extra.data is not None:
                self._tree_node.pop(extra.data, None)
            extra.remove()
        if changes.best_changed:
            self.refresh()

    # -- navigation -----------------------------------------------------------------------------

    def select_id(self, node_id: int, scroll: bool = True) -> bool:
        """Open the path to `node_id` (filling lazily) and put the cursor on it."""
        if self.filter_mode == "all":
            for ancestor in self.state.path_to(node_id)[:-1]:
                self._fill(ancestor)
                tree_node = self._tree_node.get(ancestor)
                if tree_node is not None and not tree_node.is_expanded:
                    tree_node.expand()
        target = self._tree_node.get(node_id)
        if target is None:
            return False
        _ = self.last_line  # rebuilds the line list now, so the target knows its line
        self.move_cursor(target, animate=False)
        if scroll:
            self.call_after_refresh(self.scroll_to_node, target, animate=False)
        return True
