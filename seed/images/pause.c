/* pause: the process holding a Kubernetes pod's namespaces (its sandbox).
 *
 * Ring's own, built by `ringctl images build` with `gcc -static -Os` into the
 * image ring/pause. It sleeps until SIGINT or SIGTERM (then exits 0) and reaps
 * every child re-parented to it, as upstream's pause does. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
	(void)sig;
	_exit(0);
}

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	struct sigaction sa;

	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("pause (ring) 3.2");
		return 0;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not running as pid 1\n");

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = stop;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
		return 1;
	sa.sa_handler = reap;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) < 0)
		return 2;

	for (;;)
		pause();
	return 42; /* not reached */
}
