#!/usr/bin/env bash
# A trained ViT-S/16 at 224x224 for the int8 agreement figures, from the embedded MNIST alone
# (this machine cannot download ImageNet weights, and random weights give one top-1 class for
# every image, so agreement on them says nothing). 16 epochs at 64x64 (4x4 patches, cheap),
# then 5 at 224x224 on 3000 training digits; ~35 min on 2 quiet cores with native bf16.
#   bash benchmarks/train_vit_s16_mnist.sh runs/vit_s16_mnist
#   vtfm benchmark --checkpoint runs/vit_s16_mnist/s4/vit_small_patch16_224-*/best.pt ...
set -euo pipefail
out=${1:-runs/vit_s16_mnist}
common=(data.in_chans=3 data.num_workers=1 run.precision=bf16 run.threads=2
    optim.weight_decay=0.05 optim.clip_grad=1.0 aug.kind=affine aug.rotate=10 aug.translate=0.1)
newest() { ls -d "$1"/vit_small_patch16_224-*/ | tail -n 1; }
train() { python train_cls.py --model vit_small_patch16_224 "$@" "${common[@]}"; }

train --epochs 10 --out-dir "$out/s1" data.img_size=64 data.batch_size=64 optim.lr=1e-3 \
    sched.warmup_epochs=1
train --epochs 6 --out-dir "$out/s2" model.pretrained="$(newest "$out/s1")best.pt" \
    data.img_size=64 data.batch_size=64 optim.lr=3e-4 sched.warmup_epochs=0
train --epochs 2 --out-dir "$out/s3" model.pretrained="$(newest "$out/s2")best.pt" \
    data.img_size=224 data.batch_size=32 data.train_subset=3000 optim.lr=1e-4 sched.warmup_epochs=0
train --epochs 3 --out-dir "$out/s4" model.pretrained="$(newest "$out/s3")best.pt" \
    data.img_size=224 data.batch_size=32 data.train_subset=3000 optim.lr=2e-4 sched.warmup_epochs=0
echo "checkpoint: $(newest "$out/s4")best.pt"
