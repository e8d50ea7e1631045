"""``python -m trl_rlvr.scripts.options_doc [--check]``: rewrite (or check) the options table of docs/trainer.md from
RLVRConfig's help texts (:mod:`trl_rlvr.options_doc`)."""

from __future__ import annotations

import argparse
import sys

from trl_rlvr.options_doc import _docs_page, options_markdown, rendered_page


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/trainer.md is not current")
    args = parser.parse_args(argv)
    from trl_rlvr.config import PARAMETER_GROUPS, RLVRConfig

    page = _docs_page()
    current = page.read_text()
    wanted = rendered_page(current, options_markdown(RLVRConfig, PARAMETER_GROUPS))
    if args.check:
        if wanted != current:
            print(f"{page} is not current: run python -m trl_rlvr.scripts.options_doc", file=sys.stderr)
            return 1
        return 0
    page.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
