<?php
// Runs a PHP program as `php main.php` would. One without any "<?" tag is
// PHP code all the same (a model often leaves the tag out): "<?php " goes
// before it on its first line, so that line numbers stay the program's.
//
// Usage: php run-php.php SOURCE. The agent starts it before the run comes
// (-prestart), with SOURCE /dev/fd/3: PHP's start is over when the program
// arrives there.
// PHP resolves /dev/fd/N to the pipe it links to, which is no file: such a
// source is read as php://fd/N.
$__runbox_source = file_get_contents(preg_replace('#^/dev/fd/(\d+)$#', 'php://fd/$1', $argv[1]));
if (strpos($__runbox_source, '<?') === false) {
    $__runbox_source = '<?php ' . $__runbox_source;
}
@mkdir('/tmp/runbox', 0700);
file_put_contents('/tmp/runbox/main.php', $__runbox_source);
chdir('/data'); // started in /, see internal/agent/prestart.go
unset($__runbox_source);
$argv = $_SERVER['argv'] = ['/tmp/runbox/main.php'];
$argc = $_SERVER['argc'] = 1;
$_SERVER['SCRIPT_FILENAME'] = $_SERVER['SCRIPT_NAME'] = $_SERVER['PHP_SELF'] = '/tmp/runbox/main.php';
require '/tmp/runbox/main.php';
