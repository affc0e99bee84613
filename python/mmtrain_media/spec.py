"""The numbers upstream MagiHuman fixes (GAIR-NLP/daVinci-MagiHuman @ 209209b, inference/pipeline)."""

FPS = 25                       # video frames per second the model was trained on
AUDIO_SAMPLE_RATE = 51200      # audio is loaded at this rate: 51200 / 2048 = 25 latent frames a second
AUDIO_WINDOW_SECONDS = 29      # load_audio_and_encode: the Oobleck VAE sees 29 s windows...
AUDIO_WINDOW_OVERLAP = 0.5     # ...overlapping by half, merged by merge_overlapping_vae_features
TEXT_TOKENS = 640              # t5_gemma_target_length: the embedding is trimmed to this many rows
VAE_TEMPORAL_STRIDE = 4        # Wan2.2 VAE: 1 + 4k frames give 1 + k latent frames
VAE_SPATIAL_STRIDE = 16
PATCH = 2                      # 1x2x2 patches of the latent: tokens of 4 * z_dim channels
PIXELS_PER_TOKEN = VAE_SPATIAL_STRIDE * PATCH   # a resolution must be a multiple of this (32)
MIN_FRAMES = 1 + VAE_TEMPORAL_STRIDE            # one latent frame beyond the first
