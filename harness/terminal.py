"""Text that came from outside, made safe to print: never markup, never raw terminal escapes.

    from harness.terminal import shown, plain
    console.print(f"[bold]{shown(candidate_id)}[/] why: {shown(rationale)}")   # rich markup around outside text
    print(plain(diff_text))                                                      # plain print of outside text

Outside text is anything a run did not write itself: engineer replies and their rejection reasons, endpoint error
bodies, rationales, skill fields, run ids and folder names, diffs of candidate commits. Printed through rich as markup,
`[/x]` raises MarkupError (and kills the run's live progress); printed raw, ESC/CSI/OSC sequences move the cursor,
retitle the window or rewrite what the reader sees. `plain` replaces every C0/C1 control character except newline and
tab (and the bidirectional overrides that reorder a line) with its visible escape (`\\x1b`); `shown` also escapes rich
markup. Every CLI print of outside text goes through one of them.
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls but \t and \n, DEL, C1 controls, and the bidi embeddings/overrides/isolates (U+202A-U+202E, U+2066-U+2069)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def plain(text: Any) -> str:
    """`text` as a string whose control characters (but newline and tab) are shown as `\\xNN` / `\\uNNNN` escapes."""
    return _CONTROL.sub(_visible, str(text))


def shown(text: Any) -> str:
    """`plain(text)` with rich markup escaped: safe inside a rich markup string or a Table cell."""
    from rich.markup import escape

    return escape(plain(text))
