package cuda

// LogProfile is logProfile for the external test package's benchmarks.
var LogProfile = logProfile
