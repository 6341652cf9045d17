"""podctl's JAX side: the Qwen3 model, its SFT train step, and the bundle exporter.

Nothing here touches an accelerator: bundles are lowered from shapes on the CPU backend, and the
reference runner uses CPU devices only.
"""

__version__ = "0.1.0"
