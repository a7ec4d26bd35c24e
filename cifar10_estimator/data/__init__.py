"""From the user's data to batches: sources (CIFAR-10/100 archives, sample data, image
folders), the record schema and metadata, the TFRecord writer, and the input pipeline."""
