"""A communication-heavy network: a small convolutional trunk and a large
fully connected head (AlexNet/VGG-like proportions), so that gradient
traffic dominates a step even on a CPU."""

import torch.nn as nn


class FCHeavyNet(nn.Module):
    def __init__(self, num_classes: int = 100, image_size: int = 32, hidden: int = 2048):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        flat = 64 * (image_size // 4) ** 2
        self.classifier = nn.Sequential(
            nn.Linear(flat, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
