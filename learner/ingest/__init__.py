"""The actor link: messages in and out of the learner's sockets, checked, logged, settled and acknowledged;
parameters published. It hands settled episodes on and knows nothing of training."""
