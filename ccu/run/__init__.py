"""Running the experiments: profiles, checks of names, training and scoring a method
(:mod:`~ccu.run.experiment`), the adversarial-noise experiment, the guarantees step, the steps the
command line and the workflow call, time boxes and the GPU bookkeeping."""
