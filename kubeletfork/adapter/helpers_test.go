package adapter

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

func metav1ObjectMeta(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }
