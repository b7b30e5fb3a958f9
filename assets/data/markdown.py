"""Markdown tables for asset metadata (the UI renders them)."""


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in row) + " |"
              for row in rows]
    return "\n".join(lines)
