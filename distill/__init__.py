"""Training stages: pretrain and fine-tune the teacher, build the transfer set, distil students."""
