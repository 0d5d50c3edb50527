"""A draft model from the registry proposes tokens (transformers' assisted generation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DraftModelProposer:
    draft_tokens: int
    model_name: str
    kind: str = "draft"

    @property
    def counts_acceptance(self) -> bool:
        return True

    def generation_args(self) -> dict[str, Any]:
        return {}

    def generate_kwargs(self, loader: Any, target: Any) -> dict[str, Any]:
        assistant = loader.model(self.model_name, "draft model")
        _check_same_vocabulary(self.model_name, target, assistant)
        # A constant draft length and no confidence-based early exit, so no call depends on earlier ones:
        # the assistant's generation_config persists between calls, so set it every time.
        gc = assistant.generation_config
        gc.num_assistant_tokens = self.draft_tokens
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0
        return {"assistant_model": assistant}


def _check_same_vocabulary(draft_name: str, target: Any, draft: Any) -> None:
    sizes = (target.config.get_text_config().vocab_size, draft.config.get_text_config().vocab_size)
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"draft_model: {draft_name} has a {sizes[1]}-token vocabulary but the target has "
            f"{sizes[0]}; a draft must share its target's tokenizer"
        )
