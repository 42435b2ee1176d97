package cuda

// LogProfile is logProfile for the external test package's benchmarks.
var LogProfile = logProfile

// LogProfileLess is logProfileLess for the external test package.
var LogProfileLess = logProfileLess

// ApplyTestEnv adds the test environment's DEEPINFER_CUDA_* switches
// (optionsFromTestEnv) to the options of a backend that something else
// opened: the engine benchmarks' backend, which llm opens from the config.
// Call it before the backend queues any work (from the model constructor);
// it fails once a graph exists.
func ApplyTestEnv(b *Backend) error {
	o, err := optionsFromTestEnv(b.opts)
	if err != nil {
		return err
	}
	return b.setOptions(o)
}

// Forward, MaxRelErr and Argmax are forward, maxRelErr and argmax (the
// fixture tests' one-sequence step, error and top-1) for the external test
// package.
var (
	Forward   = forward
	MaxRelErr = maxRelErr
	Argmax    = argmax
)
