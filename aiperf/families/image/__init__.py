"""The image classification family: graphs of convolutions trained on labelled images."""
