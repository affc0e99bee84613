"""The numbers upstream MagiHuman fixes (GAIR-NLP/daVinci-MagiHuman @ 209209b, inference/pipeline)."""

FPS = 25                       # video frames per second the model was trained on
AUDIO_SAMPLE_RATE = 51200      # audio is loaded at this rate: 51200 / 2048 = 25 latent frames a second
AUDIO_HOP = 2048               # samples per audio latent frame (the Oobleck VAE's downsampling)
AUDIO_WINDOW_SECONDS = 29      # load_audio_and_encode: the Oobleck VAE sees 29 s windows...
AUDIO_WINDOW_OVERLAP = 0.5     # ...overlapping by half, merged by merge_overlapping_vae_features
TEXT_TOKENS = 640              # t5_gemma_target_length: the embedding is trimmed to this many rows
VAE_TEMPORAL_STRIDE = 4        # Wan2.2 VAE: 1 + 4k frames give 1 + k latent frames
VAE_SPATIAL_STRIDE = 16
PATCH = 2                      # 1x2x2 patches of the latent: tokens of 4 * z_dim channels
PIXELS_PER_TOKEN = VAE_SPATIAL_STRIDE * PATCH   # a resolution must be a multiple of this (32)
MIN_FRAMES = 1 + VAE_TEMPORAL_STRIDE            # one latent frame beyond the first

# The negative prompt of upstream's base sampler (video_generate.py): classifier-free guidance
# steers away from its embedding. Video, then audio, then voice faults.
NEGATIVE_PROMPT = (
    "Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, static, "
    "overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, extra fingers, poorly "
    "drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, fused fingers, still picture, messy "
    "background, three legs, many people in the background, walking backwards"
    ", low quality, worst quality, poor quality, noise, background noise, hiss, hum, buzz, crackle, static, "
    "compression artifacts, MP3 artifacts, digital clipping, distortion, muffled, muddy, unclear, echo, reverb, room "
    "echo, over-reverberated, hollow sound, distant, washed out, harsh, shrill, piercing, grating, tinny, thin sound, "
    "boomy, bass-heavy, flat EQ, over-compressed, abrupt cut, jarring transition, sudden silence, looping artifact, "
    "music, instrumental, sirens, alarms, crowd noise, unrelated sound effects, chaotic, disorganized, messy, cheap "
    "sound"
    ", emotionless, flat delivery, deadpan, lifeless, apathetic, robotic, mechanical, monotone, flat intonation, "
    "undynamic, boring, reading from a script, AI voice, synthetic, text-to-speech, TTS, insincere, fake emotion, "
    "exaggerated, overly dramatic, melodramatic, cheesy, cringey, hesitant, unconfident, tired, weak voice, "
    "stuttering, stammering, mumbling, slurred speech, mispronounced, bad articulation, lisp, vocal fry, creaky voice, "
    "mouth clicks, lip smacks, wet mouth sounds, heavy breathing, audible inhales, plosives, p-pops, coughing, "
    "clearing throat, sneezing, speaking too fast, rushed, speaking too slow, dragged out, unnatural pauses, awkward "
    "silence, choppy, disjointed, multiple speakers, two voices, background talking, out of tune, off-key, autotune "
    "artifacts"
)
