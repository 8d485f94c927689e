// Vue 2 with its template compiler (the full build), so that components
// may give their template as a string.
import Vue from 'vue/dist/vue.esm.js';
import App from './App.js';

new Vue({ render: (h) => h(App) }).$mount('#root');
