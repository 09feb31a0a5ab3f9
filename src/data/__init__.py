"""Data layer of lioncub: the corpora and datasets of Lion Cub, Section 7 and Appendix D.

* GPT (Section 7, Appendix D.1): OpenWebText, or any local text corpus, tokenized with GPT-2 BPE by
  `prepare_text` into `train.bin` / `val.bin`; `TokenWindows` samples per-rank random windows from them.
  `prepare_demo_text` prepares an offline corpus (CPython's `pydoc_data.topics`) through the same step.
* Vision (Section 7.2, Appendix D.2): CIFAR-100 from the official pickle archive (`CIFAR100Folder`) with the
  paper's augmentation (`train_transform`: crop, flip, AutoAugment, Cutout); `make_synthetic_cifar` writes a small
  learnable stand-in in the same format.
"""
import warnings

# `python -m src.data.prepare_text` (and the other CLIs) run a module this package has already imported; runpy
# then warns that it "may result in unpredictable behaviour". Here it is harmless (the modules have no import-time
# side effects), and the eager imports below are what keep `src.data.prepare_text` bound to the function rather
# than to its module of the same name, so we silence that one warning for this package's modules only.
warnings.filterwarnings("ignore", message=r"'src\.data\.\w+' found in sys\.modules", category=RuntimeWarning)

# ruff: noqa: E402
from .cifar import CIFAR100Folder, cifar_num_classes, extract_cifar_archive, resolve_cifar_folder
from .cifar_pickle import dump_cifar_pickle, load_cifar_pickle
from .cifar_transforms import CIFAR100_MEAN, CIFAR100_STD, Cutout, eval_transform, train_transform
from .demo_corpus import prepare_demo_text, write_demo_corpus
from .errors import DataError
from .prepare_text import prepare_text
from .synthetic_cifar import make_synthetic_cifar
from .text_loader import TokenWindows, validate_token_folder
from .text_sources import open_source
from .token_meta import read_meta
from .tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE, find_gpt2_bpe_file, gpt2_encoding

__all__ = [
    "CIFAR100Folder", "cifar_num_classes", "extract_cifar_archive", "resolve_cifar_folder",
    "dump_cifar_pickle", "load_cifar_pickle",
    "CIFAR100_MEAN", "CIFAR100_STD", "Cutout", "eval_transform", "train_transform",
    "prepare_demo_text", "write_demo_corpus", "DataError", "prepare_text", "make_synthetic_cifar",
    "TokenWindows", "validate_token_folder", "open_source", "read_meta",
    "EOT_TOKEN", "GPT2_VOCAB_SIZE", "find_gpt2_bpe_file", "gpt2_encoding",
]
