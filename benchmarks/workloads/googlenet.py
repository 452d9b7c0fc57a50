"""GoogLeNet (Inception v1, Szegedy et al. 2015) with batch normalisation,
laid out like ``torchvision.models.googlenet(aux_logits=False)``: the same
layers, shapes, module names and weight initialisation, so the two are
interchangeable (a state dict of one loads into the other) and benchmark
figures do not depend on which one ran. The fallback for machines where
torchvision does not import; tests/test_workloads.py checks the match.

Like torchvision's, the 5x5 branch of each Inception block uses a 3x3
convolution (torchvision keeps this deviation from the paper for its
pretrained weights). Input size is free down to 32 px: a global average pool
precedes the classifier. 6.6 M parameters with 1000 classes (5.6 M with 25).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicConv2d(nn.Module):
    """Convolution without bias, batch norm (eps 1e-3), ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


class Inception(nn.Module):
    """Four parallel branches concatenated on channels: 1x1; 1x1->3x3;
    1x1->3x3 (the "5x5" branch); 3x3 max-pool->1x1."""

    def __init__(self, cin, c1, c3r, c3, c5r, c5, pool_proj):
        super().__init__()
        self.branch1 = BasicConv2d(cin, c1, 1)
        self.branch2 = nn.Sequential(BasicConv2d(cin, c3r, 1), BasicConv2d(c3r, c3, 3, padding=1))
        self.branch3 = nn.Sequential(BasicConv2d(cin, c5r, 1), BasicConv2d(c5r, c5, 3, padding=1))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), BasicConv2d(cin, pool_proj, 1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.2, init_weights: bool = True):
        super().__init__()
        self.conv1 = BasicConv2d(3, 64, 7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = BasicConv2d(64, 64, 1)
        self.conv3 = BasicConv2d(64, 192, 3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(1024, num_classes)
        if init_weights:
            self._init_weights()

    def _init_weights(self):
        # torchvision's scheme: weights from N(0, 0.01) cut at two standard
        # deviations, biases as PyTorch leaves them, batch norm at identity.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=0.01, a=-0.02, b=0.02)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool2(self.conv3(self.conv2(self.maxpool1(self.conv1(x)))))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        x = self.inception4d(self.inception4c(self.inception4b(self.inception4a(x))))
        x = self.maxpool4(self.inception4e(x))
        x = self.inception5b(self.inception5a(x))
        return self.fc(self.dropout(self.avgpool(x).flatten(1)))
