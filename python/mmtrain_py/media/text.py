"""Text: the T5Gemma encoder's last hidden state for a caption, as upstream's get_padded_t5_gemma_embedding.

The whole caption goes through the encoder (its attention sees every token); the output is cast
to fp16 (upstream's `.half()`) and trimmed to the first 640 rows. Only the caption's own rows are
stored, since training packs only those (SingleData keeps txt_feat[:original_len]).
Shape: [min(tokens, 640), hidden] fp16.
"""

import torch

from . import spec

MAX_CAPTION_BYTES = 16 * 1024  # a caption file above this is refused unread (the encoder's memory grows with it)


class TextEncoder:
    def __init__(self, path, device, dtype):
        from transformers import AutoTokenizer
        from transformers.models.t5gemma import T5GemmaEncoderModel

        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = T5GemmaEncoderModel.from_pretrained(
            path, is_encoder_decoder=False, dtype=dtype, local_files_only=True, use_safetensors=True).to(device).eval()
        self.hidden_size = self.model.config.encoder.hidden_size

    @torch.no_grad()
    def encode(self, caption):
        """(embedding [min(n, 640), hidden] fp16, n): n is the caption's token count."""
        inputs = self.tokenizer([caption], return_tensors="pt").to(self.device)
        hidden = self.model(**inputs)["last_hidden_state"].half()[0]
        return hidden[:spec.TEXT_TOKENS].cpu().contiguous(), hidden.shape[0]

    def offload(self):
        """Frees the device memory of the encoder (prepare encodes every caption first, then the clips)."""
        self.model.to("cpu")
        del self.model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
