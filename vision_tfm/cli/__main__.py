"""``python -m vision_tfm.cli``: the ``vtfm`` command."""

from . import main

main()
