<?php

// For a plain `require '<chime>/clients/php/autoload.php';` without composer (composer.json
// loads this file too).
require_once __DIR__ . '/src/Exceptions.php';
require_once __DIR__ . '/src/Signature.php';
require_once __DIR__ . '/src/Consumer.php';
require_once __DIR__ . '/src/Client.php';
