"""A Kubernetes cluster on this machine for development and the tests: the real etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, JobSet and Kueue, built from
pinned Go modules (build.py), started on 127.0.0.1 (cluster.py), with a process kubelet
that runs pods as local processes (kubelet.py). `fm dev cluster up|down|status`;
docs/kubernetes.md."""
