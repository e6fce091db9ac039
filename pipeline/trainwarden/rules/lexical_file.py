"""``settings.lexical`` of a rule file: the learned lexical model the pack
weighs (evidence/lexical.py), kept in the rule file itself so that it goes
wherever the rules go (a ConfigMap, a wheel, a copy of the directory).

    settings:
      lexical:
        confidence: 0.15     # how far from 0.5 its probability must be to decide
        bias: 0.31
        trained_on: "tuning set of tests/data/failure_corpus: 591 excerpts"
        weights: |
          abort 0.230128
          aborted core -0.287929

``bench/train_lexical.py`` writes it. ``lexical: {enabled: false}`` in a
later file switches the model off (the catalogue alone then judges).
"""

from __future__ import annotations

from typing import Optional

from trainwarden.evidence.lexical import LexicalModel, WeightsError, parse_weights
from trainwarden.limits import RULES
from trainwarden.yamlsrc import ConfigError, Fields

# The weights of one model; past this it is not a model someone trained. A rule
# file is refused past the same size before it is parsed (limits.RULES); this
# holds for a pack built from a document that did not come from a file.
MAX_WEIGHTS_CHARS = RULES.max_file_bytes


def lexical_setting(fields: Fields) -> Optional[LexicalModel]:
    """The model ``settings.lexical`` holds (None: switched off)."""
    enabled = fields.get("enabled", bool, True)
    if not enabled:
        fields.done()
        return None
    confidence = fields.get("confidence", (int, float), 0.15)
    bias = fields.get("bias", (int, float))
    trained_on = fields.get("trained_on", str, "")
    text = fields.get("weights", str, what="the weights, one 'word weight' per line (a block scalar: weights: |)")
    fields.done()
    if not 0 < confidence < 0.5:
        raise fields.error("confidence", "confidence must be between 0 and 0.5",
                           hint="how far from 0.5 the model's probability must be to decide, e.g. 0.3")
    if not -1e6 < bias < 1e6:
        raise fields.error("bias", "bias is out of range")
    if len(text) > MAX_WEIGHTS_CHARS:
        raise fields.error("weights", f"the weights are longer than {MAX_WEIGHTS_CHARS} characters")
    try:
        weights = parse_weights(text)
    except WeightsError as exc:
        # A block scalar's first line is the one after its key.
        raise ConfigError(f"settings.lexical.weights: {exc}", fields.path, fields.line("weights") + exc.line,
                          hint="bench/train_lexical.py writes them: one 'word weight' per line") from None
    return LexicalModel(bias=float(bias), weights=weights, confidence=float(confidence), trained_on=trained_on)
