"""mmtrain's media room: the encoders and decoders MagiHuman's data needs, on the ecosystem's libraries.

Clips are decoded with PyAV, the Wan2.2 video VAE and Stable Audio Open's Oobleck VAE run through
diffusers, and the T5Gemma text encoder through transformers. The C++ side (`mmtrain prepare`, `mmtrain
sample`, `mmtrain fixture magihuman-encoders | clips`) parses the flags and runs the modules here:

- spec.py      the numbers upstream fixes (fps, sample rate, windows, token count)
- files.py     the trust boundary: opening what the user gave, writing outputs atomically
- clips.py     finding the clips (a directory or a JSONL manifest) and their captions
- video.py     frames at 25 fps, upstream's resize-crop, the VAE latents and their 1x2x2 patches
- audio.py     51200 Hz mono-made-stereo samples, the Oobleck latents in overlapping windows
- text.py      the T5Gemma encoder's last hidden state, trimmed to 640 tokens
- prepare.py   `mmtrain prepare magihuman`: clips in, the magihuman_precomputed layout out
- decode.py    `mmtrain prepare magihuman --decode`: that layout (or `mmtrain sample`'s latents) back to mp4s
- embed.py     `mmtrain sample magihuman`'s prompt embeddings (and upstream's negative prompt)
- mp4.py       writing an mp4 with sound (H.264 + AAC)
- fixtures.py  tiny random-weight encoders of the real classes, and synthetic clips

docs/prepare.md writes the encoding down.
"""

import warnings

# diffusers' Oobleck VAE still builds its convolutions with torch's deprecated weight_norm; the
# warning says nothing a user of this room can act on.
warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
