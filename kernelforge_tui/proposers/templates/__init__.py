"""The built-in, offline proposer: parameterised CUDA templates per op family and mutations over them."""

from kernelforge_tui.proposers.templates.proposer import TEMPLATES, TemplateProposer, template_for

__all__ = ["TEMPLATES", "TemplateProposer", "template_for"]
