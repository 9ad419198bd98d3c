"""CSV cells that a spreadsheet shows as text: no cell we write is ever run as a formula.

A class name or a file name is user data. One that begins with `=`, `+`, `-`, `@`, a tab or a
carriage return would be read by Excel, LibreOffice or Google Sheets as a formula (CSV
injection: `=cmd|' /C calc'!A0`), so such a text cell is written with a leading `'`, as
OWASP advises. Numbers are written as they are.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: object) -> object:
    """`value`, with a `'` in front when it is text that a spreadsheet would read as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def safe_row(values) -> list:
    """Every cell of a CSV row through `safe_cell`."""
    return [safe_cell(value) for value in values]
