"""``concord sweep --preset NAME``: named reproduction grids with their own report.

`spec` says what a preset is, `catalog` holds the presets, `run` runs one through the sweep
machinery and `report` (with `plots` and `cells`) writes its ``report.md`` and PNGs.
"""

from concord.lab.presets.catalog import PRESETS, get_preset
from concord.lab.presets.run import get_study, list_presets, preset_main, studies
from concord.lab.presets.spec import (
    Preset,
    PresetGrid,
    PresetRequest,
    Relation,
    RunList,
    Setting,
    Setup,
    Study,
    command_line,
    select,
)
from concord.lab.sweep import run_without_plots

__all__ = [
    "PRESETS",
    "Preset",
    "PresetGrid",
    "PresetRequest",
    "Relation",
    "RunList",
    "Setting",
    "Setup",
    "Study",
    "command_line",
    "get_preset",
    "get_study",
    "list_presets",
    "preset_main",
    "run_without_plots",
    "select",
    "studies",
]
