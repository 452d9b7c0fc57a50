"""GoogLeNet (Inception v1, Szegedy et al. 2015) with batch normalisation.

Input size and class count are free: the classifier follows a global average
pool. ``stem="imagenet"`` is the paper's 7x7/2 stem with two pools (for
inputs of 64 px and up); ``stem="small"`` is a 3x3/1 stem without pools, for
32 px inputs. About 7.0 M parameters with 1000 classes (6.0 M with 25).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBN(nn.Sequential):
    def __init__(self, cin, cout, kernel, stride=1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )


class Inception(nn.Module):
    """Four parallel branches concatenated on channels: 1x1; 1x1->3x3;
    1x1->5x5; 3x3 max-pool->1x1."""

    def __init__(self, cin, c1, c3r, c3, c5r, c5, pool_proj):
        super().__init__()
        self.b1 = ConvBN(cin, c1, 1)
        self.b2 = nn.Sequential(ConvBN(cin, c3r, 1), ConvBN(c3r, c3, 3))
        self.b3 = nn.Sequential(ConvBN(cin, c5r, 1), ConvBN(c5r, c5, 5))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), ConvBN(cin, pool_proj, 1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int = 1000, stem: str = "imagenet", dropout: float = 0.4):
        super().__init__()
        if stem == "imagenet":
            self.stem = nn.Sequential(
                ConvBN(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), ConvBN(64, 64, 1), ConvBN(64, 192, 3), nn.MaxPool2d(3, 2, 1)
            )
        elif stem == "small":
            self.stem = ConvBN(3, 192, 3)
        else:
            raise ValueError(f"stem must be 'imagenet' or 'small', got {stem!r}")
        self.a3 = Inception(192, 64, 96, 128, 16, 32, 32)
        self.b3 = Inception(256, 128, 128, 192, 32, 96, 64)
        self.pool3 = nn.MaxPool2d(3, 2, 1)
        self.a4 = Inception(480, 192, 96, 208, 16, 48, 64)
        self.b4 = Inception(512, 160, 112, 224, 24, 64, 64)
        self.c4 = Inception(512, 128, 128, 256, 24, 64, 64)
        self.d4 = Inception(512, 112, 144, 288, 32, 64, 64)
        self.e4 = Inception(528, 256, 160, 320, 32, 128, 128)
        self.pool4 = nn.MaxPool2d(3, 2, 1)
        self.a5 = Inception(832, 256, 160, 320, 32, 128, 128)
        self.b5 = Inception(832, 384, 192, 384, 48, 128, 128)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.pool3(self.b3(self.a3(x)))
        x = self.pool4(self.e4(self.d4(self.c4(self.b4(self.a4(x))))))
        x = self.b5(self.a5(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(self.dropout(x))
