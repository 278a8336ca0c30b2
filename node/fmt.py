"""Small formatting helpers shared by the displays (progress bars, live tables, summaries)."""


def fmt_bytes(n: float) -> str:
    """1234567 → '1.2 MB' (decimal units, as network traffic is usually read)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"
