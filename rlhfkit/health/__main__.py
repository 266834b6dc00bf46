"""``python -m rlhfkit.health > docs/health.md``"""

import sys

from rlhfkit.health.docs import render_markdown

sys.stdout.write(render_markdown())
