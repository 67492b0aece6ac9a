"""The numerical core: tensors in, tensors out (no transformers, Altair or widgets).

operators.py  DiagonalSSM (and its naive materialisation)   short_conv.py  gated short conv
sweeps.py     square-root sweeps of the factored path         spectra.py     sigma(H_t), dense + dispatch
ess.py        tolerance / entropy ESS, aggregates               diagnostics.py TSS, utilisation, modulation
units.py      one layer's unit operators                        layer.py       the one LayerESS builder
"""
