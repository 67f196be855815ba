"""Kanboard's "Application" procedures: version, timezone and the task colors."""

from __future__ import annotations

from fabric.embedded.procedures.base import Board, procedure

API_VERSION = "1.2.53-agap-embedded"  # real Kanboard says "1.2.53"; this tells them apart

# Kanboard's default task colors, as getDefaultTaskColors reports them.
COLORS: dict[str, dict[str, str]] = {
    "yellow": {"name": "Yellow", "background": "rgb(245, 247, 196)", "border": "rgb(223, 227, 45)"},
    "blue": {"name": "Blue", "background": "rgb(219, 235, 255)", "border": "rgb(168, 207, 255)"},
    "green": {"name": "Green", "background": "rgb(189, 244, 203)", "border": "rgb(74, 227, 113)"},
    "purple": {"name": "Purple", "background": "rgb(223, 176, 255)", "border": "rgb(205, 133, 254)"},
    "red": {"name": "Red", "background": "rgb(255, 187, 187)", "border": "rgb(255, 151, 151)"},
    "orange": {"name": "Orange", "background": "rgb(255, 215, 179)", "border": "rgb(255, 172, 98)"},
    "grey": {"name": "Grey", "background": "rgb(238, 238, 238)", "border": "rgb(204, 204, 204)"},
    "brown": {"name": "Brown", "background": "#d7ccc8", "border": "#4e342e"},
    "deep_orange": {"name": "Deep Orange", "background": "#ffab91", "border": "#e64a19"},
    "dark_grey": {"name": "Dark Grey", "background": "#cfd8dc", "border": "#455a64"},
    "pink": {"name": "Pink", "background": "#f48fb1", "border": "#d81b60"},
    "teal": {"name": "Teal", "background": "#80cbc4", "border": "#00695c"},
    "cyan": {"name": "Cyan", "background": "#b2ebf2", "border": "#00bcd4"},
    "lime": {"name": "Lime", "background": "#e6ee9c", "border": "#afb42b"},
    "light_green": {"name": "Light Green", "background": "#dcedc8", "border": "#689f38"},
    "amber": {"name": "Amber", "background": "#ffe082", "border": "#ffa000"},
}


@procedure
def getVersion(api: Board) -> str:
    return API_VERSION


@procedure
def getTimezone(api: Board) -> str:
    return "UTC"


@procedure
def getDefaultTaskColors(api: Board) -> dict[str, dict[str, str]]:
    return COLORS


@procedure
def getDefaultTaskColor(api: Board) -> str:
    return "yellow"


@procedure
def getColorList(api: Board) -> dict[str, str]:
    return {k: v["name"] for k, v in COLORS.items()}
