"""The PyTorch face of tierfeed: the only package that imports torch.utils.data."""

from tierfeed.torch.imagefolder import IMG_EXTENSIONS, ImageFolder, pil_loader

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "pil_loader"]
