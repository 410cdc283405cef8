"""Shape-stabilizing collation: pad samples to a few fixed sizes so compiled graphs are reused.

A compiled region specializes on input shapes. With variable-length sequences or variable-size images
every new batch shape is a recompile (or, once dynamo marks the dim dynamic, slower kernels). Padding
every batch to one of a few fixed sizes ("bucket edges") bounds the number of graphs; the price is
padded elements that cost compute and do nothing. This module holds both halves:

- choosing the edges: :class:`ShapeCensus` counts observed sizes and :func:`choose_buckets` picks at
  most ``max_buckets`` edges that minimize padded elements, by exact dynamic programming;
- applying them: :class:`PadCollate`, a picklable collate function that pads token sequences
  (``pad_id``; labels with -100; an attention mask of 1s and 0s), images (zeros at bottom/right, or a
  resize) and the batch dimension of a short last batch (samples that are masked out of the loss).

Padding statistics. ``PadCollate.stats`` counts real and total elements of the batches *this copy*
produced; with ``num_workers > 0`` the copies in the worker processes do that work and the main
process's copy sees nothing. Batches therefore carry no extra keys or attributes (a key would break
``model(**batch)``, an attribute does not survive pinning or device transfer); instead
:func:`padding_stats` (or :meth:`PadCollate.padding_stats`) reads real vs padded elements back from
a batch in the main process: from the attention mask, else labels != -100, else tokens != pad id.
It returns the real count as a tensor on the batch's device, so reading it every step costs no host
sync until the caller converts it. Image pixels are exact only with a pixel mask (``image_mask_field``
on dict samples); without one, a padded image counts as all real unless its whole sample is a masked
short-batch filler, so the reading is a lower bound of the pixel waste.

Nothing here imports Lightning; the callback decides when to census, which edges to use and where to
inject the collate (``compile_callback.loaders``).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index
ROLES = ("tokens", "labels", "mask", "segments", "image")
PER_TOKEN_ROLES = ("tokens", "mask", "segments")  # 1-D per sample, padded to the batch's length
IMAGE_MODES = ("pad", "resize")
OVERSIZE_MODES = ("raise", "pad")
SHORT_BATCH_MODES = ("pad", "drop", "keep")

# Roles of the conventional (Hugging Face / torchvision style) keys of dict samples, used when
# ``fields`` is not given. Keys a sample does not have are ignored; keys not listed pass through.
DEFAULT_DICT_FIELDS: dict[str, str] = {
    "input_ids": "tokens",
    "labels": "labels",
    "label": "labels",
    "attention_mask": "mask",
    "token_type_ids": "segments",
    "pixel_values": "image",
    "image": "image",
}

_PIXEL_MASK = "pixel_mask"  # internal role of the produced ``image_mask_field``

FieldKey = str | int
Fields = str | Mapping[FieldKey, str]


def _align_up(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1; got {value!r}.")


def _check_edges(name: str, edges: Any) -> tuple[int, ...]:
    """Edges as a sorted tuple of distinct positive ints, or a ValueError that says which one was wrong."""
    if isinstance(edges, (str, bytes)) or not isinstance(edges, Iterable):
        raise ValueError(f"`{name}` must be a list of positive integers (bucket edges); got {edges!r}.")
    edges = list(edges)
    if not edges:
        raise ValueError(f"`{name}` must name at least one bucket edge; got an empty list.")
    for edge in edges:
        if isinstance(edge, bool) or not isinstance(edge, int) or edge < 1:
            raise ValueError(f"`{name}` must hold positive integers (bucket edges); got {edge!r} in {edges!r}.")
    return tuple(sorted(set(edges)))


def _check_sizes(sizes: Any, *, max_size: int | None) -> list[int]:
    if isinstance(sizes, ShapeCensus):
        sizes = sizes.sizes()
    sizes = list(sizes)
    if not sizes:
        raise ValueError(
            "`sizes` is empty: buckets are chosen from observed sizes. Census some samples first "
            "(ShapeCensus.add(len(sample))) or give explicit edges."
        )
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise ValueError(f"`sizes` must hold integers (lengths or image sides); got {size!r}.")
        if size < 0:
            raise ValueError(f"`sizes` must hold sizes >= 0; got {size}.")
        if max_size is not None and size > max_size:
            raise ValueError(
                f"size {size} is larger than max_size={max_size}. Raise max_size, or truncate samples "
                f"to at most {max_size} before taking the census."
            )
    return sizes


# ---------------------------------------------------------------------------------------------------
# Choosing bucket edges
# ---------------------------------------------------------------------------------------------------


class ShapeCensus:
    """Counts of observed sizes (sequence lengths, image sides): the input of :func:`choose_buckets`.

    Args:
        sizes: sizes to count right away.

    Example:
        >>> census = ShapeCensus([5, 7, 7])
        >>> census.add(30)
        >>> census.most_common(1)
        [(7, 2)]
        >>> choose_buckets(census.sizes(), max_buckets=2)
        [8, 32]
    """

    def __init__(self, sizes: Iterable[int] = ()) -> None:
        self.counts: collections.Counter[int] = collections.Counter()
        self.update(sizes)

    def add(self, size: int) -> None:
        """Counts one observed size.

        Raises:
            ValueError: if ``size`` is not an integer >= 0.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"ShapeCensus counts integer sizes >= 0; got {size!r}.")
        self.counts[size] += 1

    def update(self, sizes: Iterable[int]) -> None:
        """Counts every size in ``sizes``."""
        for size in sizes:
            self.add(size)

    def most_common(self, n: int | None = None) -> list[tuple[int, int]]:
        """``(size, count)`` pairs, most frequent first (ties by smaller size)."""
        ranked = sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))
        return ranked if n is None else ranked[:n]

    def sizes(self) -> list[int]:
        """Every observed size with its repeats, ascending."""
        return [size for size in sorted(self.counts) for _ in range(self.counts[size])]

    def __len__(self) -> int:
        return sum(self.counts.values())

    def __repr__(self) -> str:
        return f"ShapeCensus({len(self)} observations, {len(self.counts)} distinct sizes)"


def choose_buckets(
    sizes: Sequence[int] | ShapeCensus, *, max_buckets: int, multiple: int = 8, max_size: int | None = None
) -> list[int]:
    """Chooses at most ``max_buckets`` edges that minimize padded elements over ``sizes``.

    Every size is padded up to the smallest edge that holds it; the cost is ``sum(edge(s) - s)``.
    Edges are multiples of ``multiple`` (tensor-core friendly shapes), the largest one holds
    ``max(sizes)``, and none exceeds ``max_size`` (an edge that would is lowered to ``max_size``, so
    with a ``max_size`` that is not a multiple the top edge is not one either). An optimal set only
    uses sizes aligned up to ``multiple`` as edges (lowering an edge to the largest aligned size it
    holds never adds padding), so an exact dynamic program over those ``k`` candidates solves it in
    ``O(k^2 * max_buckets)``. Of the optimal sets the one with fewest edges is returned (fewer graphs).

    Args:
        sizes: observed sizes with repeats (a list of lengths, or a :class:`ShapeCensus`).
        max_buckets: the budget of edges, i.e. of compiled graphs per padded dim.
        multiple: every edge is a multiple of this (1 for no alignment).
        max_size: the largest size allowed (e.g. the model's context length); edges never exceed it.

    Returns:
        The edges, ascending.

    Raises:
        ValueError: if ``sizes`` is empty or holds a negative or non-integer size or one larger than
            ``max_size``, or if ``max_buckets``, ``multiple`` or ``max_size`` is not an integer >= 1.

    Example:
        >>> choose_buckets([100, 120, 128, 500, 510], max_buckets=2, multiple=8)
        [128, 512]
    """
    _check_positive_int("max_buckets", max_buckets)
    _check_positive_int("multiple", multiple)
    if max_size is not None:
        _check_positive_int("max_size", max_size)
    counts = collections.Counter(_check_sizes(sizes, max_size=max_size))

    def candidate(size: int) -> int:
        edge = max(multiple, _align_up(size, multiple))
        return edge if max_size is None else min(edge, max_size)

    # Group the sizes by their candidate edge: group j holds count[j] sizes summing to total[j].
    group_count: dict[int, int] = collections.defaultdict(int)
    group_total: dict[int, int] = collections.defaultdict(int)
    for size, count in counts.items():
        group_count[candidate(size)] += count
        group_total[candidate(size)] += size * count
    edges = sorted(group_count)
    k = len(edges)
    # Prefix sums over groups 1..j (index 0 is "no group"), so that covering groups i+1..j with the
    # edge edges[j-1] costs edges[j-1] * (n[j] - n[i]) - (s[j] - s[i]).
    n = [0] * (k + 1)
    s = [0] * (k + 1)
    for j, edge in enumerate(edges, start=1):
        n[j] = n[j - 1] + group_count[edge]
        s[j] = s[j - 1] + group_total[edge]

    def cost(i: int, j: int) -> int:
        return edges[j - 1] * (n[j] - n[i]) - (s[j] - s[i])

    budget = min(max_buckets, k)
    infinity = float("inf")
    # best[b][j]: least padding of groups 1..j with b edges, the last one edges[j-1]; came_from the i.
    best = [[infinity] * (k + 1) for _ in range(budget + 1)]
    came_from = [[0] * (k + 1) for _ in range(budget + 1)]
    best[0][0] = 0
    for b in range(1, budget + 1):
        for j in range(b, k + 1):
            for i in range(b - 1, j):
                if best[b - 1][i] == infinity:
                    continue
                value = best[b - 1][i] + cost(i, j)
                if value < best[b][j]:
                    best[b][j] = value
                    came_from[b][j] = i
    # Fewest edges among the optimal sets: strict < keeps the smallest b on ties.
    chosen_b = min(range(1, budget + 1), key=lambda b: (best[b][k], b))
    chosen: list[int] = []
    j = k
    for b in range(chosen_b, 0, -1):
        chosen.append(edges[j - 1])
        j = came_from[b][j]
    return sorted(chosen)


def bucket_for(size: int, edges: Sequence[int]) -> int:
    """The smallest edge that holds ``size``.

    Args:
        size: a length or image side.
        edges: bucket edges, ascending.

    Raises:
        ValueError: if ``edges`` is empty or not ascending, or ``size`` is larger than the largest edge.

    Example:
        >>> bucket_for(100, [64, 128, 256])
        128
    """
    if not edges:
        raise ValueError("`edges` is empty: give at least one bucket edge.")
    if any(a >= b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"`edges` must be strictly ascending; got {list(edges)}. Sort them and drop repeats.")
    index = bisect.bisect_left(edges, size)
    if index == len(edges):
        raise ValueError(
            f"size {size} is larger than the largest bucket edge {edges[-1]}. Raise max_size (or add an "
            f"edge >= {size}) so the buckets cover it, or truncate samples to {edges[-1]} "
            "(PadCollate(truncate=True))."
        )
    return edges[index]


def padding_waste(sizes: Sequence[int] | ShapeCensus, edges: Sequence[int]) -> float:
    """Padded elements / all elements when each size is padded to its bucket edge.

    Args:
        sizes: observed sizes with repeats (or a :class:`ShapeCensus`).
        edges: bucket edges; sorted here.

    Raises:
        ValueError: as :func:`bucket_for`, or if ``sizes`` is empty.

    Example:
        >>> padding_waste([6, 8], [8])  # (2 + 0) padded of 16
        0.125
    """
    edges = _check_edges("edges", edges)
    sizes = _check_sizes(sizes, max_size=None)
    padded = total = 0
    for size in sizes:
        edge = bucket_for(size, edges)
        padded += edge - size
        total += edge
    return padded / total if total else 0.0


# ---------------------------------------------------------------------------------------------------
# Padding statistics
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PaddingStats:
    """Real and total elements (token positions, image pixels, or samples) of produced batches.

    ``real_elements`` is an int when counted by the collate, a 0-d tensor on the batch's device when
    read back from a batch by :func:`padding_stats` (converting it with ``int()`` is a host sync).
    """

    real_elements: int | torch.Tensor = 0
    total_elements: int = 0

    @property
    def padded_elements(self) -> int | torch.Tensor:
        return self.total_elements - self.real_elements

    @property
    def waste(self) -> float | torch.Tensor:
        """Padded / total elements (0.0 before any batch)."""
        if not self.total_elements:
            return 0.0
        return self.padded_elements / self.total_elements

    def __add__(self, other: PaddingStats) -> PaddingStats:
        return PaddingStats(self.real_elements + other.real_elements, self.total_elements + other.total_elements)


def _resolve_fields(container: Any, fields: Fields | None, *, what: str) -> list[tuple[FieldKey | None, str]]:
    """``(key, role)`` pairs for one sample or batch; key None is the bare tensor itself."""
    if isinstance(container, Mapping):
        if fields is None:
            return [(key, role) for key, role in DEFAULT_DICT_FIELDS.items() if key in container]
        if isinstance(fields, str):
            raise ValueError(
                f"{what} is a dict, but `fields` is the single role {fields!r} (for bare tensors). Give "
                "`fields` as {key: role}, e.g. {'input_ids': 'tokens', 'labels': 'labels'}."
            )
        missing = [key for key in fields if key not in container]
        if missing:
            raise ValueError(
                f"`fields` names {missing} but the {what} has keys {list(container)}. Name keys that every "
                "sample has, or leave `fields=None` for the conventional names."
            )
        return list(fields.items())
    if isinstance(container, (tuple, list)):
        if fields is None and _is_image_and_label(container, batch=what == "batch"):
            return [(0, "image"), (1, "labels")]  # torchvision's and timm's (image, class) pairs
        if fields is None or isinstance(fields, str):
            raise ValueError(
                f"{what} is a {type(container).__name__} of {len(container)} items, so PadCollate needs "
                "`fields` to say which position holds what, e.g. fields={0: 'tokens', 1: 'labels'} or "
                "fields={0: 'image', 1: 'labels'}."
            )
        size = len(container)
        bad = [key for key in fields if isinstance(key, bool) or not isinstance(key, int) or not -size <= key < size]
        if bad:
            raise ValueError(
                f"`fields` names positions {bad} but the {what} is a {type(container).__name__} of "
                f"{len(container)} items. Use integer positions 0..{len(container) - 1}."
            )
        return [(key % len(container), role) for key, role in fields.items()]
    if isinstance(container, torch.Tensor):
        if not isinstance(fields, str):
            raise ValueError(
                f"{what} is a bare tensor of shape {tuple(container.shape)}, so `fields` must be its role "
                f"as a string, one of {ROLES} (e.g. fields='tokens'); got {fields!r}."
            )
        return [(None, fields)]
    raise TypeError(
        f"PadCollate pads dicts, tuples/lists or tensors; the {what} is a {type(container).__name__}. "
        "Return one of those from the dataset, or pass your own collate_fn."
    )


def _is_image_and_label(pair: Sequence[Any], *, batch: bool) -> bool:
    """Whether ``pair`` is an (image, class label) sample, ``(C, H, W)`` tensor and an int or 0-d tensor, or a
    batch of them (``batch``): ``(N, C, H, W)`` and ``(N,)``."""
    if len(pair) != 2 or not isinstance(pair[0], torch.Tensor) or pair[0].dim() != (4 if batch else 3):
        return False
    label = pair[1]
    if batch:
        return isinstance(label, torch.Tensor) and label.dim() == 1 and not label.is_floating_point()
    return _is_int(label) or (isinstance(label, torch.Tensor) and label.dim() == 0 and not label.is_floating_point())


def _is_int(value: Any) -> bool:
    """An integer class label: a Python int or a NumPy integer (``numbers.Integral``, as an image dataset's
    ``np.int64`` labels are; ``default_collate`` stacks them), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _get(container: Any, key: FieldKey | None) -> Any:
    return container if key is None else container[key]


def padding_stats(
    batch: Any,
    *,
    fields: Fields | None = None,
    pad_id: int = 0,
    label_pad_id: int = IGNORE_INDEX,
    mask_field: str | None = "attention_mask",
    image_mask_field: str | None = _PIXEL_MASK,
) -> PaddingStats:
    """Reads real vs total elements back from a padded batch, in whichever process holds it.

    Sequences: real token positions are the nonzero entries of the attention mask; without a mask,
    the per-token labels that are not ``label_pad_id``; without those, the tokens that are not
    ``pad_id``. Images: pixels under the pixel mask when the batch has one; otherwise whole images of
    samples whose class label is not ``label_pad_id`` (short-batch fillers count as padding, spatial
    padding is not seen: a lower bound). A batch with neither counts samples by their class labels.

    Args:
        batch: a batch as the collate returned it (dict, list/tuple, or tensor; leading dim = batch).
        fields: the same ``fields`` the :class:`PadCollate` was given.
        pad_id: token padding id.
        label_pad_id: label padding / ignore index.
        mask_field: key of the attention mask in dict batches.
        image_mask_field: key of the pixel mask in dict batches.

    Returns:
        Stats whose ``real_elements`` is a 0-d tensor on the batch's device (no host sync here).

    Raises:
        ValueError: if the batch has no field this can count (no tokens, mask, labels or images).

    Example:
        >>> batch = PadCollate(sequence_buckets=[8])([{"input_ids": torch.ones(5, dtype=torch.long)}])
        >>> float(padding_stats(batch).waste)
        0.375
    """
    layout = _resolve_fields(batch, fields, what="batch")
    if isinstance(batch, Mapping):
        if mask_field is not None and mask_field in batch and (mask_field, "mask") not in layout:
            layout.append((mask_field, "mask"))
        if image_mask_field is not None and image_mask_field in batch:
            layout.append((image_mask_field, _PIXEL_MASK))
    by_role: dict[str, list[torch.Tensor]] = collections.defaultdict(list)
    for key, role in layout:
        value = _get(batch, key)
        if isinstance(value, torch.Tensor):
            by_role[role].append(value)
    token_labels = [t for t in by_role["labels"] if t.dim() >= 2]
    class_labels = [t for t in by_role["labels"] if t.dim() == 1]

    real: int | torch.Tensor = 0
    total = 0
    counted = False
    if by_role["mask"]:
        mask = by_role["mask"][0]
        real, total, counted = real + mask.ne(0).sum(), total + mask.numel(), True
    elif token_labels:
        labels = token_labels[0]
        real, total, counted = real + labels.ne(label_pad_id).sum(), total + labels.numel(), True
    elif by_role["tokens"]:
        tokens = by_role["tokens"][0]
        real, total, counted = real + tokens.ne(pad_id).sum(), total + tokens.numel(), True
    if by_role["image"]:
        images = by_role["image"][0]
        pixels = images.shape[-2] * images.shape[-1]
        if by_role[_PIXEL_MASK]:
            pixel_mask = by_role[_PIXEL_MASK][0]
            real, total = real + pixel_mask.ne(0).sum(), total + pixel_mask.numel()
        elif class_labels:
            real, total = real + class_labels[0].ne(label_pad_id).sum() * pixels, total + images.shape[0] * pixels
        else:
            all_pixels = images.shape[0] * pixels
            real, total = real + torch.tensor(all_pixels, device=images.device), total + all_pixels
        counted = True
    if not counted:
        if not class_labels:
            raise ValueError(
                f"padding_stats found nothing to count in the batch (fields {layout}): it needs an attention "
                "mask, labels, tokens or images. Pass the `fields` the PadCollate was given."
            )
        real, total = real + class_labels[0].ne(label_pad_id).sum(), total + class_labels[0].numel()
    return PaddingStats(real, total)


# ---------------------------------------------------------------------------------------------------
# The collate function
# ---------------------------------------------------------------------------------------------------


def _pad_1d(tensor: torch.Tensor, length: int, value: int) -> torch.Tensor:
    if tensor.shape[0] == length:
        return tensor
    padded = tensor.new_full((length,), value)
    padded[: tensor.shape[0]] = tensor
    return padded


def _pad_image(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    if image.shape[-2:] == (height, width):
        return image
    padded = image.new_zeros((*image.shape[:-2], height, width))
    padded[..., : image.shape[-2], : image.shape[-1]] = image
    return padded


def _resize_image(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    if image.shape[-2:] == (height, width):
        return image
    leading = image.shape[:-2]
    # interpolate wants (N, C, H, W) floats; integer images (uint8) are resized in float and rounded back.
    flat = image.reshape(1, -1, *image.shape[-2:])
    work = flat if flat.is_floating_point() else flat.float()
    resized = F.interpolate(work, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    if not image.is_floating_point():
        info = torch.iinfo(image.dtype)
        resized = resized.round().clamp(info.min, info.max)
    return resized.to(image.dtype).reshape(*leading, height, width)


class PadCollate:
    """A collate function that pads samples to fixed sizes, then calls an inner collate.

    Per-sample padding happens before ``inner`` (``default_collate`` by default) stacks the samples,
    so the inner collate sees samples of equal shape. It is a plain class with no closures: it
    pickles, so it works with ``num_workers > 0`` under both the fork and spawn start methods.

    Fields are given roles:

    - ``"tokens"``: 1-D token ids, padded with ``pad_id`` to the batch's bucket edge.
    - ``"labels"``: 1-D per-token labels, padded with ``label_pad_id`` (-100, ignored by
      ``cross_entropy``); 0-d tensors or ints (Python or NumPy) are class labels, left as they are.
    - ``"mask"``: an attention mask, extended with 0s. On dict samples with a ``"tokens"`` field and no
      mask, one is produced under ``mask_field`` (1 for real tokens, 0 for padding, int64).
      Tuple samples get no new position (that would change how batches unpack).
    - ``"segments"``: another 1-D per-token field (BERT's ``token_type_ids``), extended with 0s; not read
      to count padding.
    - ``"image"``: a tensor ``(..., H, W)``, padded with zeros at the bottom/right or resized.

    Tuple samples need ``fields``, except ``(image, class label)`` pairs (a ``(C, H, W)`` tensor and an int), the
    torchvision and timm convention, read as ``{0: "image", 1: "labels"}``. Dict samples may hold lists of ints
    where tensors are expected (a Hugging Face ``datasets`` row). Other fields pass through unchanged.

    All sequence fields of a batch are padded to one length: the smallest of ``sequence_buckets`` that holds
    the batch's longest sequence (without buckets, that length aligned up to ``multiple``).

    The short last batch (fewer samples than ``batch_size``):

    - ``"keep"``: left short (its batch dim is one more shape for the compiler).
    - ``"pad"``: filled up to ``batch_size`` with copies of the first sample whose tokens are
      ``pad_id``, labels -100 (token and class labels), masks 0 and images 0; other fields are copied
      from that sample. A loss with ``ignore_index=-100`` and mean reduction over non-ignored targets
      is unchanged, and so are the gradients; a loss that reads no labels (e.g. BCE on a passthrough
      field) would see the fillers.
    - ``"drop"``: a collate function cannot drop a batch (whatever it returns reaches the training
      step), so dropping is the DataLoader's ``drop_last=True``
      (``compile_callback.rewrap_collate(..., drop_last=True)``); this mode asserts that:
      a short batch reaching the collate raises with that fix.

    Args:
        inner: collate applied to the padded samples (``torch.utils.data.default_collate`` if None).
        fields: roles of the sample's parts: ``{key: role}`` for dict samples (default: the
            conventional names in ``DEFAULT_DICT_FIELDS``), ``{position: role}`` for tuple/list samples
            (required), a single role string for bare-tensor samples (required).
        pad_id: token id used for padding.
        label_pad_id: label used for padding (the loss's ignore index).
        mask_field: key of the attention mask produced for dict samples (None: produce none).
        multiple: without buckets, lengths and image sides are aligned up to this.
        sequence_buckets: bucket edges for sequence lengths (None: the batch's longest, aligned).
        truncate: cut sequences longer than the largest edge to it instead of raising.
        oversize: a batch whose longest sequence (or an image side) exceeds the largest edge: ``"raise"``
            (the error says how to cover it), or ``"pad"`` to its own size aligned up to ``multiple``,
            one more shape for the compiler, with a warning the first time in each process. Nothing is cut.
        image_mode: ``"pad"`` (zeros at bottom/right) or ``"resize"`` (bilinear, to ``image_size``).
        image_size: fixed ``(H, W)`` every image is padded or resized to.
        image_buckets: bucket edges for H and W alike (``"pad"`` mode, without ``image_size``).
        image_mask_field: key of a produced ``(H, W)`` pixel mask for dict samples (None: none).
        batch_size: the DataLoader's batch size; needed by ``short_batch="pad"`` and ``"drop"``.
        short_batch: ``"keep"``, ``"pad"`` or ``"drop"``, see above.

    Raises:
        ValueError: for options out of range or that contradict each other (each message says which).

    Example:
        >>> collate = PadCollate(sequence_buckets=[8, 16], batch_size=4, short_batch="pad")
        >>> batch = collate([{"input_ids": torch.arange(1, 6), "labels": torch.arange(1, 6)}])
        >>> batch["input_ids"].shape, batch["attention_mask"][0].tolist()
        (torch.Size([4, 8]), [1, 1, 1, 1, 1, 0, 0, 0])
        >>> loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate)
    """

    # Long on purpose: every argument checked with its own message, in the signature's order.
    def __init__(
        self,
        inner: Callable[[list[Any]], Any] | None = None,
        *,
        fields: Fields | None = None,
        pad_id: int = 0,
        label_pad_id: int = IGNORE_INDEX,
        mask_field: str | None = "attention_mask",
        multiple: int = 8,
        sequence_buckets: Sequence[int] | None = None,
        truncate: bool = False,
        oversize: str = "raise",
        image_mode: str = "pad",
        image_size: tuple[int, int] | None = None,
        image_buckets: Sequence[int] | None = None,
        image_mask_field: str | None = None,
        batch_size: int | None = None,
        short_batch: str = "keep",
    ) -> None:
        if inner is not None and not callable(inner):
            raise ValueError(f"`inner` must be a collate function (callable) or None; got {inner!r}.")
        if fields is not None:
            roles = [fields] if isinstance(fields, str) else list(fields.values()) if isinstance(fields, Mapping) else None
            if roles is None:
                raise ValueError(
                    f"`fields` must be a role string, a dict {{key or position: role}} or None; got {fields!r}."
                )
            for role in roles:
                if role not in ROLES:
                    raise ValueError(f"`fields` roles must be one of {ROLES}; got {role!r}.")
        for name, value in (("pad_id", pad_id), ("label_pad_id", label_pad_id)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"`{name}` must be an integer; got {value!r}.")
        _check_positive_int("multiple", multiple)
        if image_mode not in IMAGE_MODES:
            raise ValueError(f"`image_mode` must be one of {IMAGE_MODES}; got {image_mode!r}.")
        if short_batch not in SHORT_BATCH_MODES:
            raise ValueError(f"`short_batch` must be one of {SHORT_BATCH_MODES}; got {short_batch!r}.")
        if oversize not in OVERSIZE_MODES:
            raise ValueError(f"`oversize` must be one of {OVERSIZE_MODES}; got {oversize!r}.")
        if oversize == "pad" and truncate:
            raise ValueError("truncate=True cuts what exceeds the largest edge and oversize='pad' pads it: give one.")
        if sequence_buckets is not None:
            sequence_buckets = _check_edges("sequence_buckets", sequence_buckets)
        elif truncate:
            raise ValueError(
                "truncate=True cuts sequences to the largest of `sequence_buckets`, but no buckets were given. "
                "Give sequence_buckets=[...] or leave truncate=False."
            )
        if image_size is not None:
            if (
                not isinstance(image_size, (tuple, list))
                or len(image_size) != 2
                or any(isinstance(side, bool) or not isinstance(side, int) or side < 1 for side in image_size)
            ):
                raise ValueError(f"`image_size` must be (height, width) with positive integers; got {image_size!r}.")
            image_size = (int(image_size[0]), int(image_size[1]))
        if image_buckets is not None:
            image_buckets = _check_edges("image_buckets", image_buckets)
            if image_size is not None:
                raise ValueError(
                    "Give `image_size` (one fixed H×W) or `image_buckets` (edges for H and W), not both."
                )
        if image_mode == "resize" and image_size is None:
            raise ValueError(
                "image_mode='resize' needs `image_size=(height, width)` to resize to; buckets would stretch "
                "images by different factors. Give image_size, or use image_mode='pad'."
            )
        if batch_size is not None:
            _check_positive_int("batch_size", batch_size)
        if short_batch in ("pad", "drop") and batch_size is None:
            raise ValueError(
                f"short_batch={short_batch!r} needs `batch_size` (the DataLoader's) to know what a short "
                "batch is. Give batch_size=..., or short_batch='keep'."
            )
        self.inner = inner if inner is not None else default_collate
        self.fields = dict(fields) if isinstance(fields, Mapping) else fields
        self.pad_id = pad_id
        self.label_pad_id = label_pad_id
        self.mask_field = mask_field
        self.multiple = multiple
        self.sequence_buckets = sequence_buckets
        self.truncate = truncate
        self.oversize = oversize
        self._warned_oversize = False
        self.image_mode = image_mode
        self.image_size = image_size
        self.image_buckets = image_buckets
        self.image_mask_field = image_mask_field
        self.batch_size = batch_size
        self.short_batch = short_batch
        # Counted in the process that runs the collate: with DataLoader workers, read batches with
        # padding_stats() instead (see the module docstring).
        self.stats = PaddingStats()

    def __repr__(self) -> str:
        inner = getattr(self.inner, "__name__", type(self.inner).__name__)
        options = {
            "fields": self.fields,
            "sequence_buckets": list(self.sequence_buckets) if self.sequence_buckets else None,
            "image_mode": self.image_mode,
            "image_size": self.image_size,
            "image_buckets": list(self.image_buckets) if self.image_buckets else None,
            "batch_size": self.batch_size,
            "short_batch": self.short_batch,
            "oversize": self.oversize if self.oversize != "raise" else None,
        }
        shown = ", ".join(f"{key}={value!r}" for key, value in options.items() if value is not None)
        return f"PadCollate({inner}, {shown})"

    # -- reading samples -----------------------------------------------------------------------------

    def _layout(self, sample: Any) -> list[tuple[FieldKey | None, str]]:
        layout = _resolve_fields(sample, self.fields, what="sample")
        self._check_values(sample, layout)
        return layout

    @staticmethod
    def _check_values(sample: Any, layout: list[tuple[FieldKey | None, str]]) -> None:
        for key, role in layout:
            value = _get(sample, key)
            name = "the sample" if key is None else f"field {key!r}"
            if role in PER_TOKEN_ROLES:
                if not isinstance(value, torch.Tensor) or value.dim() != 1:
                    raise ValueError(
                        f"{name} (role {role!r}) must be a 1-D tensor per sample; got {_describe(value)}. "
                        "Return tensors of shape (length,), or lists of ints, from the dataset."
                    )
            elif role == "labels":
                if isinstance(value, torch.Tensor):
                    if value.dim() > 1:
                        raise ValueError(
                            f"{name} (role 'labels') must be a class label (0-d tensor or int) or per-token "
                            f"labels (1-D tensor); got {_describe(value)}."
                        )
                elif not _is_int(value):
                    raise ValueError(
                        f"{name} (role 'labels') must be a tensor or an int class label; got {_describe(value)}."
                    )
            elif role == "image":
                if not isinstance(value, torch.Tensor) or value.dim() < 2:
                    raise ValueError(
                        f"{name} (role 'image') must be a tensor of shape (C, H, W) or (H, W); got "
                        f"{_describe(value)}. Convert images to tensors in the dataset (e.g. "
                        "torchvision.transforms.v2.ToImage)."
                    )

    def _check_like_first(self, sample: Any, index: int, first: Any, layout: list[tuple[FieldKey | None, str]]) -> None:
        """Sample ``index`` of a batch has the fields of the first one, each of the right kind."""
        if type(sample) is not type(first) and not (isinstance(sample, Mapping) and isinstance(first, Mapping)):
            raise ValueError(
                f"sample {index} of the batch is a {type(sample).__name__} but sample 0 is a "
                f"{type(first).__name__}; every sample of a dataset must have the same structure."
            )
        if isinstance(sample, Mapping):
            missing = [key for key, _ in layout if key not in sample]
            if missing:
                raise ValueError(
                    f"sample {index} of the batch lacks {missing}, which sample 0 has; got keys {list(sample)}."
                )
        elif isinstance(sample, (tuple, list)) and len(sample) != len(first):
            raise ValueError(f"sample {index} of the batch has {len(sample)} items but sample 0 has {len(first)}.")
        self._check_values(sample, layout)

    @staticmethod
    def _is_sequence(value: Any, role: str) -> bool:
        return role in PER_TOKEN_ROLES or (role == "labels" and isinstance(value, torch.Tensor) and value.dim() == 1)

    def _with_tensors(self, sample: Any) -> Any:
        """A dict sample with its per-token fields as int64 tensors where they are lists of ints (a Hugging Face
        ``datasets`` row before ``set_format("torch")``); the sample itself is not changed."""
        if not isinstance(sample, Mapping) or isinstance(self.fields, str):
            return sample
        roles = DEFAULT_DICT_FIELDS if self.fields is None else self.fields
        lists = {key: value for key, value in sample.items()
                 if roles.get(key) in (*PER_TOKEN_ROLES, "labels") and isinstance(value, (list, tuple))
                 and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value)}
        if not lists:
            return sample
        return {**sample, **{key: torch.tensor(value, dtype=torch.long) for key, value in lists.items()}}

    def measure(self, sample: Any) -> dict[str, int]:
        """Sizes of one sample as this collate sees them, for a :class:`ShapeCensus`.

        Returns:
            ``{"length": ...}`` when the sample has sequence fields (their longest) and
            ``{"height": ..., "width": ...}`` when it has images (the largest sides).

        Example:
            >>> census = ShapeCensus(PadCollate().measure(dataset[i])["length"] for i in range(1000))
        """
        sample = self._with_tensors(sample)
        layout = self._layout(sample)
        sizes: dict[str, int] = {}
        for key, role in layout:
            value = _get(sample, key)
            if self._is_sequence(value, role):
                sizes["length"] = max(sizes.get("length", 0), value.shape[0])
            elif role == "image":
                sizes["height"] = max(sizes.get("height", 0), value.shape[-2])
                sizes["width"] = max(sizes.get("width", 0), value.shape[-1])
        return sizes

    # -- choosing the batch's sizes -------------------------------------------------------------------

    def _sequence_length(self, longest: int) -> int:
        if self.sequence_buckets is None:
            return max(self.multiple, _align_up(longest, self.multiple))
        if self.truncate and longest > self.sequence_buckets[-1]:
            return self.sequence_buckets[-1]
        return self._bucket(longest, self.sequence_buckets, "sequence length")

    def _image_size(self, height: int, width: int) -> tuple[int, int]:
        if self.image_size is not None:
            if self.image_mode == "pad" and (height > self.image_size[0] or width > self.image_size[1]):
                raise ValueError(
                    f"an image of {height}×{width} does not fit image_size={self.image_size} with "
                    "image_mode='pad'. Use a larger image_size, image_mode='resize', or crop in the dataset."
                )
            return self.image_size
        if self.image_buckets is not None:
            return (self._bucket(height, self.image_buckets, "image height"),
                    self._bucket(width, self.image_buckets, "image width"))
        return max(self.multiple, _align_up(height, self.multiple)), max(self.multiple, _align_up(width, self.multiple))

    def _bucket(self, size: int, edges: Sequence[int], what: str) -> int:
        """The edge that holds ``size``; past the largest, as ``oversize`` says."""
        if size <= edges[-1] or self.oversize == "raise":
            return bucket_for(size, edges)
        padded = _align_up(size, self.multiple)
        if not self._warned_oversize:
            self._warned_oversize = True
            warnings.warn(f"a batch's {what} {size} exceeds the largest bucket edge {edges[-1]}: padded to {padded}, "
                          f"one more shape for the compiler (a recompile). Give edges that cover it (pad=[..., "
                          f"{padded}]) to keep the graphs to the buckets'.", stacklevel=2)
        return padded

    # -- padding ------------------------------------------------------------------------------------

    def _pad_sample(
        self, sample: Any, layout: list[tuple[FieldKey | None, str]], length: int | None, image_hw: tuple[int, int] | None
    ) -> tuple[Any, int, int]:
        """The padded sample, its real sequence length and its real pixels (of its first image)."""
        values = {key: _get(sample, key) for key, _ in layout}
        real_length = real_pixels = 0
        first_image: torch.Tensor | None = None
        tokens_length = None
        for key, role in layout:
            value = values[key]
            if self._is_sequence(value, role):
                value = value[:length]
                real_length = max(real_length, value.shape[0])
                if role == "tokens":
                    tokens_length = max(tokens_length or 0, value.shape[0])
                fill = self.pad_id if role == "tokens" else self.label_pad_id if role == "labels" else 0
                values[key] = _pad_1d(value, length, fill)
            elif role == "image":
                if first_image is None:
                    first_image = value
                    real_pixels = value.shape[-2] * value.shape[-1]
                height, width = image_hw
                fit = _pad_image if self.image_mode == "pad" else _resize_image
                values[key] = fit(value, height, width)
        if self.image_mode == "resize" and image_hw is not None:
            real_pixels = image_hw[0] * image_hw[1]  # resizing adds no padding

        if _is_bare(layout):
            return values[None], real_length, real_pixels
        if isinstance(sample, Mapping):
            padded = dict(sample)
            padded.update(values)
            if self.mask_field is not None and tokens_length is not None and self.mask_field not in sample:
                padded[self.mask_field] = _pad_1d(torch.ones(tokens_length, dtype=torch.long), length, 0)
            if self.image_mask_field is not None and first_image is not None:
                pixel_mask = torch.zeros(image_hw, dtype=torch.long)
                if self.image_mode == "resize":
                    pixel_mask.fill_(1)
                else:
                    pixel_mask[: first_image.shape[-2], : first_image.shape[-1]] = 1
                padded[self.image_mask_field] = pixel_mask
            return padded, real_length, real_pixels
        items = list(sample)
        for key, value in values.items():
            items[key] = value
        return _rebuild_sequence(sample, items), real_length, real_pixels

    def _filler(self, padded: Any, layout: list[tuple[FieldKey | None, str]]) -> Any:
        """A sample masked out of every loss that uses the labels: the first padded sample, blanked."""
        roles = dict(layout)
        if isinstance(padded, Mapping):
            if self.mask_field is not None and self.mask_field in padded:
                roles.setdefault(self.mask_field, "mask")
            if self.image_mask_field is not None and self.image_mask_field in padded:
                roles.setdefault(self.image_mask_field, _PIXEL_MASK)
        if _is_bare(layout):
            return self._blank(padded, roles[None])
        if isinstance(padded, Mapping):
            return {key: self._blank(value, roles[key]) if key in roles else value for key, value in padded.items()}
        items = [self._blank(value, roles[index]) if index in roles else value for index, value in enumerate(padded)]
        return _rebuild_sequence(padded, items)

    def _blank(self, value: Any, role: str) -> Any:
        if role == "labels":
            return torch.full_like(value, self.label_pad_id) if isinstance(value, torch.Tensor) else self.label_pad_id
        if role == "tokens":
            return torch.full_like(value, self.pad_id)
        return torch.zeros_like(value)  # masks, segments, pixel masks, images

    # Long on purpose: the checks on a batch come before any padding, so a bad sample costs no work.
    def __call__(self, samples: list[Any]) -> Any:
        """Pads ``samples`` (one batch, as the DataLoader gives it) and collates them with ``inner``.

        Raises:
            TypeError: if ``samples`` is not a list (e.g. a DataLoader with ``batch_size=None``).
            ValueError: if a sample does not fit the configuration (the message says which field and
                how), more samples than ``batch_size`` arrive, or a short batch arrives with
                ``short_batch="drop"``.
        """
        if not isinstance(samples, list):
            raise TypeError(
                f"PadCollate expects the list of samples of one batch; got a {type(samples).__name__}. A "
                "DataLoader with batch_size=None passes single items: give it a batch_size (or a "
                "batch_sampler), or pad inside the dataset."
            )
        if not samples:
            raise ValueError("PadCollate got an empty batch; a DataLoader never sends one, check the sampler.")
        real_count = len(samples)
        if self.batch_size is not None and real_count > self.batch_size:
            raise ValueError(
                f"PadCollate got {real_count} samples but batch_size={self.batch_size}. Give PadCollate the "
                "DataLoader's batch_size."
            )
        if self.short_batch == "drop" and real_count < self.batch_size:
            raise ValueError(
                f"PadCollate(short_batch='drop') got a short batch of {real_count} samples (batch_size="
                f"{self.batch_size}). A collate function cannot drop a batch: build the DataLoader with "
                "drop_last=True (compile_callback.rewrap_collate(loader, wrap, drop_last=True)), or "
                "use short_batch='pad'."
            )
        samples = [self._with_tensors(sample) for sample in samples]
        layout = self._layout(samples[0])
        for index, sample in enumerate(samples[1:], start=1):
            self._check_like_first(sample, index, samples[0], layout)
        maskable = any(role in ("labels", "mask") for _, role in layout)
        if self.short_batch == "pad" and real_count < self.batch_size and not maskable:
            raise ValueError(
                "short_batch='pad' masks its filler samples through labels (-100) and attention masks (0), "
                f"but the samples have no field with role 'labels' or 'mask' (fields {layout}). Name the "
                "labels in `fields`, or use short_batch='keep' or 'drop'."
            )
        length = image_hw = None
        longest = height = width = -1
        for sample in samples:
            for key, role in layout:
                value = _get(sample, key)
                if self._is_sequence(value, role):
                    longest = max(longest, value.shape[0])
                elif role == "image":
                    height, width = max(height, value.shape[-2]), max(width, value.shape[-1])
        if longest >= 0:
            length = self._sequence_length(longest)
        if height >= 0:
            image_hw = self._image_size(height, width)

        padded: list[Any] = []
        real = 0
        for sample in samples:
            padded_sample, real_length, real_pixels = self._pad_sample(sample, layout, length, image_hw)
            padded.append(padded_sample)
            real += real_length + real_pixels
        batch_count = real_count
        if self.short_batch == "pad" and real_count < self.batch_size:
            filler = self._filler(padded[0], layout)
            padded.extend(filler for _ in range(self.batch_size - real_count))
            batch_count = self.batch_size

        total = 0
        if length is not None:
            total += batch_count * length
        if image_hw is not None:
            total += batch_count * image_hw[0] * image_hw[1]
        if length is None and image_hw is None:
            real, total = real_count, batch_count
        self.stats = self.stats + PaddingStats(real, total)
        return self.inner(padded)

    def padding_stats(self, batch: Any) -> PaddingStats:
        """:func:`padding_stats` of a batch this collate produced, read with this collate's settings."""
        return padding_stats(
            batch,
            fields=self.fields,
            pad_id=self.pad_id,
            label_pad_id=self.label_pad_id,
            mask_field=self.mask_field,
            image_mask_field=self.image_mask_field,
        )


def _is_bare(layout: list[tuple[FieldKey | None, str]]) -> bool:
    return len(layout) == 1 and layout[0][0] is None


def _rebuild_sequence(original: Any, items: list[Any]) -> Any:
    if hasattr(original, "_fields"):  # a namedtuple
        return type(original)(*items)
    return type(original)(items)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
