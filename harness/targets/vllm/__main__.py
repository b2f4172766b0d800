"""``python -m harness.targets.vllm``: build one checkpoint variant with vLLM and time each step."""

from harness.targets.vllm.build import main

raise SystemExit(main())
